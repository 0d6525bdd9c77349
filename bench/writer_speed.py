"""The writer's speed, partitions side by side: figures, never assertions.

- writer rows/s with 1 writer and with one per partition (LOCAL_PARTITIONS, each in a process of its own as the event
  source mapping's pollers invoke their own function instances): the writer's Lambda handler given MSK events of
  signed ledger events (decode, MAC check, persist: one transaction per batch, then the Redis settle), batches of the
  template's BatchSize over 200 accounts; an account's events all go to one partition, as the publisher keys them;
- the ack->DB lag p50/p99 at the bench's offered load: deducts acknowledged by the API (ASYNC), persisted by the
  local runtime's pollers over the broker, the lag read from t_order.persist_time.
Runs on the bench's own Redis, schema and topic (bench/run.py's environment; alone, the schema
hotledger_bench_writer). Alone (from the repo root):
    PYTHONPATH=functions:. .venv/bin/python bench/writer_speed.py [--quick] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing as mp
import os
import pstats
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "functions"), str(REPO), str(REPO / "bench")]

from workers import START_ALLOWANCE_S, gather  # noqa: E402

TOPIC = "hotledger.bench.writer"


def template_batch_size() -> int:
    """The writer's MSK BatchSize in template.yaml: the bench writes batches as large as the deployment's."""
    from infra.localrt.template import load

    return next(f.msk["batch_size"] for f in load(REPO / "template.yaml") if f.name == "WriterFunction")


def msk_batches(partition: int, user_ids: list[int], rows: int, batch: int, first_version: int) -> list[dict]:
    """MSK events of `rows` signed ledger events over user_ids (one partition's accounts), `batch` records each."""
    from hotledger.dal.event_keys import record_value
    from hotledger.outbox.events import LedgerEvent, signed
    from hotledger.runtime import event_keys, id_generator

    from infra.localrt import events

    keyring, ids, now = event_keys().keyring(), id_generator(), int(time.time() * 1000)
    records = []
    for i in range(rows):
        user_id = user_ids[i % len(user_ids)]
        event = LedgerEvent(type="ledger", id=ids.next_id(), kind="R", user_id=user_id, amount=100, balance_after=100,
                            version=first_version + i, epoch="bench", ts=now, open="1")
        value = record_value(signed(event.model_dump(), keyring))  # as the service publishes it
        records.append((partition, i, str(user_id).encode(), value, now))
    return [events.msk(TOPIC, records[i:i + batch]) for i in range(0, rows, batch)]


def _writer_process(warm_up: dict, batches: list[dict], start, profile: bool, out) -> None:
    """One partition's writer: its own process, warmed up (imports, connections), then, once every writer is ready,
    its batches one after another. Hands back (started, ended)."""
    sys.stdout = open(os.devnull, "w")  # the handler prints an EMF line per invocation
    from writer.app import handler

    from infra.localrt.events import LambdaContext

    context = LambdaContext("WriterFunction")
    handler(warm_up, context)
    start.wait(timeout=START_ALLOWANCE_S)
    started = time.time()
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    for event in batches:
        handler(event, context)
    ended = time.time()
    if profiler:
        profiler.disable()
        profiler.dump_stats(str(REPO / ".state" / f"writer-{os.getpid()}.prof"))
    out.put((started, ended))


def writer_rows_per_s(call, writers: int, rows_per_writer: int, accounts: int, profile: bool = False) -> float:
    """Rows/s of `writers` processes side by side, each persisting its partition's batches; accounts split among them."""
    user_ids = [call("POST", "/accounts", {"user_name": f"ws-{uuid.uuid4().hex[:10]}"})[1]["user_id"] for _ in range(accounts)]
    batch = template_batch_size()
    start = mp.get_context("spawn").Barrier(writers)  # gather spawns the workers
    args = []
    for p in range(writers):
        mine = user_ids[p::writers]
        args.append((msk_batches(p, mine[:1], 1, 1, 2)[0], msk_batches(p, mine, rows_per_writer, batch, 3), start, profile))
    spans = gather(_writer_process, args, 2 * START_ALLOWANCE_S)
    return round(writers * rows_per_writer / (max(e for _, e in spans) - min(s for s, _ in spans)), 1)


def ack_to_db_lag(call, run_workers, pct, env: dict, procs: int, seconds: float, rate: float, log_dir: Path) -> dict:
    """Deducts at `rate`/s over 100 accounts through the API (in-process, ASYNC); the local runtime's pollers persist
    them from the broker; the lag of each deduct acknowledged after a 3 s ramp, ack -> t_order.persist_time."""
    from hotledger.dal import db

    user_ids = []
    for _ in range(100):
        user_id = call("POST", "/accounts", {"user_name": f"lag-{uuid.uuid4().hex[:10]}"})[1]["user_id"]
        call("POST", f"/accounts/{user_id}/recharge", {"amount": "1000000.00"})
        user_ids.append(user_id)
    writer_proc = subprocess.Popen([sys.executable, "-m", "infra.localrt.runtime", "--no-api", "--no-schedules"], cwd=REPO,
                                   env=env, stdout=open(log_dir / "writer-runtime.log", "wb"), stderr=subprocess.STDOUT)
    try:
        time.sleep(8)  # the pollers start and take the setup events
        started = time.time()
        latencies, acks = run_workers(procs, user_ids, seconds, rate)
        window = [a for a in acks if a[1] / 1000 >= started + 3]
        pending = {order_id: acked for order_id, acked in window}
        deadline, persisted = time.monotonic() + 120, {}
        while time.monotonic() < deadline and len(persisted) < len(pending):
            time.sleep(1)
            chunk = [i for i in pending if i not in persisted]
            for i in range(0, len(chunk), 5000):
                part = chunk[i:i + 5000]
                rows = db.query(f"SELECT id, UNIX_TIMESTAMP(persist_time) * 1000 FROM t_order WHERE id IN ({','.join(['%s'] * len(part))})", part)
                persisted.update((row[0], float(row[1])) for row in rows)
        lags = [persisted[i] - pending[i] for i in persisted]
        missing = [i for i in pending if i not in persisted]
        return {"target_deducts_per_s": rate, "achieved_deducts_per_s": round(len(window) / seconds, 1),
                "ack_to_db_lag_p50_ms": pct(lags, 0.5), "ack_to_db_lag_p99_ms": pct(lags, 0.99),
                "ack_to_db_lag_max_ms": round(max(lags), 1) if lags else None, "not_persisted": len(missing),
                **(where_missing(missing, user_ids) if missing else {})}
    finally:
        writer_proc.terminate()
        writer_proc.wait()


def rows_per_run(quick: bool, writers: int) -> int:
    """Rows of one run: each writer persists 20 batches (quick: 5), a sustained rate rather than a burst of a few
    batches whose processes' start and descheduling on 2 shared cores weigh as much as their work."""
    return writers * template_batch_size() * (5 if quick else 20)


def where_missing(entry_ids: list[int], user_ids: list[int]) -> dict:
    """Where acknowledged deducts the DB did not get within the wait are: still pending in Redis (the reconciler
    persists them after RECONCILE_AGE_S; this run has no schedules), and on the topic or not (not: the broker lost a
    record it acknowledged; on it: the pollers did not deliver it)."""
    from kafka import KafkaConsumer, TopicPartition

    from hotledger import keys
    from hotledger.config import settings
    from hotledger.dal.redis_store import lua

    client, cfg = lua().client, settings()
    pending = sum(any(client.exists(keys.entry(u, i)) for u in user_ids) for i in entry_ids)
    reader = KafkaConsumer(bootstrap_servers=cfg.kafka_bootstrap.split(","), enable_auto_commit=False)
    try:
        partitions = [TopicPartition(cfg.kafka_topic, p) for p in reader.partitions_for_topic(cfg.kafka_topic) or ()]
        reader.assign(partitions)
        reader.seek_to_beginning()
        wanted, found, quiet = {str(i).encode() for i in entry_ids}, {}, 0
        while quiet < 5:  # 5 empty polls in a row: read to the end
            polled = reader.poll(timeout_ms=500, max_records=10_000)
            quiet = 0 if polled else quiet + 1
            for records in polled.values():
                for r in records:
                    found.update((w, f"{r.partition}:{r.offset}") for w in wanted if b'"id":' + w in r.value)
    finally:
        reader.close()
    return {"not_persisted_pending_in_redis": pending, "not_persisted_on_topic": sorted(found.values()),
            "not_persisted_ids": entry_ids[:10]}


def figures(call, run_workers, pct, env: dict, procs: int, quick: bool, log_dir: Path, profile: bool = False) -> dict:
    from infra import services

    partitions = services.LOCAL_PARTITIONS
    one = writer_rows_per_s(call, 1, rows_per_run(quick, 1), 200, profile)
    side_by_side = writer_rows_per_s(call, partitions, rows_per_run(quick, partitions) // partitions, 200, profile)
    out = {"writer_batch_rows": template_batch_size(), "writer_partitions": partitions,
           "writer_rows_per_s_1_writer": one, "writer_rows_per_s": side_by_side,
           "writer_partitions_vs_1_ratio": round(side_by_side / one, 2)}
    out.update(ack_to_db_lag(call, run_workers, pct, env, procs, 5 if quick else 15, 2000, log_dir))
    return out


def main() -> int:
    import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--procs", type=int, default=8, help="API client processes for the lag's offered load")
    parser.add_argument("--profile", action="store_true", help="cProfile each writer process: .state/writer-<pid>.prof")
    parser.add_argument("--no-lag", action="store_true", help="the writer figures alone")
    args = parser.parse_args()
    with run.environment("hotledger_bench_writer") as (_cfg, _redis, state):
        env = {**os.environ}
        real_stdout = sys.stdout
        run._quiet()
        call = run._api()
        if args.no_lag:
            from infra import services

            partitions = services.LOCAL_PARTITIONS
            result = {"writer_rows_per_s_1_writer": writer_rows_per_s(call, 1, rows_per_run(args.quick, 1), 200, args.profile),
                      "writer_rows_per_s": writer_rows_per_s(call, partitions, rows_per_run(args.quick, partitions) // partitions,
                                                             200, args.profile)}
        else:
            result = figures(call, run.run_workers, run._pct, env, args.procs, args.quick, state, args.profile)
        sys.stdout = real_stdout
    print(json.dumps(result, indent=2))
    if args.profile:
        stats = pstats.Stats(*[str(p) for p in (REPO / ".state").glob("writer-*.prof")])
        stats.sort_stats("cumulative").print_stats(45)
    return 0


if __name__ == "__main__":
    sys.exit(main())
