"""The writer on its real path, and the lag from an acknowledged charge to its DB commit at fixed rates: figures, never
assertions.

- writer rows/s, 1 partition (one poller, one writer) against LOCAL_PARTITIONS side by side, the same work in both:
  `rows` ASYNC deducts charged through the API handler (so each entry is pending in Redis and its event, signed, on
  the broker), one account per row; then the local runtime's MSK pollers read them from the broker, the writer
  persists them (one transaction per batch) and settles them in Redis. Timed from the first rows seen committed to
  the last entry settled (nothing pending in Redis): rows/s in total and per partition.
- ack -> commit lag at fixed offered rates (deducts over 100 accounts, paced, in-process handler calls), the local
  runtime's pollers persisting as they come: every deduct acknowledged in the window is followed until an observer
  sees its row committed (polling the DB, POLL_S apart: the lag is an upper bound, at most POLL_S over), with the
  achieved rate and the count not committed within DRAIN_S (must be 0).
Runs on bench/run.py's Redis, schema and topic; alone (from the repo root):
    PYTHONPATH=functions:. .venv/bin/python bench/writer_speed.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "functions"), str(REPO), str(REPO / "bench")]

import clients  # noqa: E402
import stats  # noqa: E402
from workers import START_ALLOWANCE_S, gather  # noqa: E402

POLL_S = 0.01
DRAIN_S = 60.0
LAG_ACCOUNTS = 100


def template_batch_size() -> int:
    """The writer's MSK BatchSize in template.yaml."""
    from infra.localrt.template import load

    return next(f.msk["batch_size"] for f in load(REPO / "template.yaml") if f.name == "WriterFunction")


def bulk_accounts(n: int, balance: int) -> list[int]:
    """n ASYNC accounts holding `balance` minor units, open, made in the DB directly and cached as imported accounts are
    (a setup, not a figure). Left uncached, each first charge would load its account as a rebuild after a Redis loss
    does, reading the log's unapplied tail (up to log_hold.SCAN_LIMIT records) for the account's own records: with the
    writer stopped while a stage charges, that is n reads of a growing tail, hours at 12,000 accounts."""
    from hotledger.dal import db
    from hotledger.ledger.feature import ledger

    prefix = f"bw-{uuid.uuid4().hex[:8]}-"
    for start in range(0, n, 2000):
        names = [f"{prefix}{i}" for i in range(start, min(n, start + 2000))]
        with db.transaction() as cur:
            cur.execute(
                "INSERT INTO t_user (user_name, api_open, close_reason, deduct_type) VALUES "
                + ",".join(["(%s, 1, NULL, 'ASYNC')"] * len(names)),
                names,
            )
    with db.transaction() as cur:
        cur.execute(
            "INSERT INTO t_account (user_id, balance, version, threshold) SELECT id, %s, 1, 0 FROM t_user"
            " WHERE user_name LIKE %s",
            (balance, prefix + "%"),
        )
    user_ids = [
        row[0] for row in db.query("SELECT id FROM t_user WHERE user_name LIKE %s ORDER BY id", (prefix + "%",))
    ]
    for user_id in user_ids:
        ledger().load_cache(user_id, after_loss=False)
    return user_ids


def created_accounts(call, n: int, balance: str = "") -> list[int]:
    """n ASYNC accounts made as a user makes them, through the API handler (`call`, clients.api()): POST /accounts,
    which caches each at creation, then a recharge of `balance` when given."""
    prefix, user_ids = f"ca-{uuid.uuid4().hex[:8]}-", []
    for i in range(n):
        status, body = call("POST", "/accounts", {"user_name": f"{prefix}{i}", "deduct_type": "ASYNC"})
        if status not in (200, 201):
            raise RuntimeError(f"POST /accounts answered {status}: {body}")
        user_ids.append(body["user_id"])
        if balance:
            status, body = call("POST", f"/accounts/{body['user_id']}/recharge", {"amount": balance})
            if status != 200:
                raise RuntimeError(f"recharge answered {status}: {body}")
    return user_ids


def _charge_worker(user_ids: list[int], out) -> None:
    clients.quiet()
    call = clients.api()
    ok = sum(call("POST", f"/accounts/{u}/deduct", {"amount": "0.01"})[0] == 200 for u in user_ids)
    out.put(ok)


def runtime(env: dict, log_path: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "infra.localrt.runtime", *flags],
        cwd=REPO,
        env=env,
        stdout=open(log_path, "wb"),
        stderr=subprocess.STDOUT,
    )


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the live process `pid` and its live descendants have used: the local runtime and
    the pollers it forked (each partition's writer), read from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the fields after the command's closing parenthesis: state, ppid, ..., utime (12th), stime (13th)
            fields = stat.read_bytes().rsplit(b")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(stat.parent.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    tree, grown = {pid}, True
    while grown:
        children = {child for child, (parent, _) in parents.items() if parent in tree} - tree
        tree |= children
        grown = bool(children)
    return sum(parents[p][1] for p in tree if p in parents) / os.sysconf("SC_CLK_TCK")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def writer_rows_per_s(env: dict, procs: int, partitions: int, rows: int, log_dir: Path) -> dict:
    """`rows` deducts, one account each, charged through the handler onto a topic of `partitions` partitions, then
    persisted and settled by the local runtime's pollers and writer."""
    from hotledger import keys
    from hotledger.config import settings
    from hotledger.dal import db
    from hotledger.dal.redis_store import lua
    from infra import services

    cfg = settings()
    topic = f"{cfg.kafka_topic}.writer{partitions}.{uuid.uuid4().hex[:6]}"
    services.ensure_topic(cfg.kafka_bootstrap, topic, partitions)
    user_ids = bulk_accounts(rows, 1_000_000)
    previous = os.environ["KAFKA_TOPIC"]
    os.environ["KAFKA_TOPIC"] = topic  # the spawned charging workers publish there
    try:
        charged = sum(gather(_charge_worker, [(user_ids[i::procs],) for i in range(procs)], 600 + START_ALLOWANCE_S))
    finally:
        os.environ["KAFKA_TOPIC"] = previous
    lo, hi = user_ids[0], user_ids[-1]
    client = lua().client

    def committed() -> int:
        return db.query("SELECT COUNT(*) FROM t_order WHERE user_id BETWEEN %s AND %s", (lo, hi))[0][0]

    def pending() -> int:
        pipe = client.pipeline(transaction=False)
        for u in user_ids:
            pipe.zcard(keys.pending(u))
        return sum(pipe.execute())

    proc = runtime({**env, "KAFKA_TOPIC": topic}, log_dir / f"writer-{partitions}.log", "--no-api", "--no-schedules")
    try:
        deadline = time.monotonic() + 300
        first = first_count = first_cpu_s = None
        while time.monotonic() < deadline:
            now, count = time.monotonic(), committed()
            if first is None and count:
                first, first_count, first_cpu_s = now, count, tree_cpu_s(proc.pid)
            if count >= charged:
                break
            time.sleep(0.05)
        while time.monotonic() < deadline and pending():
            time.sleep(0.05)
        ended, left = time.monotonic(), pending()
        cpu_s = tree_cpu_s(proc.pid) - first_cpu_s if first_cpu_s is not None else None
        count = committed()
    finally:
        stop(proc)
    measured = count - (first_count or 0)
    per_s = round(measured / (ended - first), 1) if first is not None and ended > first else None
    return {
        "rows": charged,
        "per_s": per_s,
        "per_partition_per_s": round(per_s / partitions, 1) if per_s else None,
        # the rows over the CPU the writer's processes used in the same window (their own, not Redis's, the DB's or
        # the broker's): on AWS each partition's writer has a CPU of its own, here they share 2 cores with everything
        "per_cpu_s": stats.ratio(measured, cpu_s, 1),
        "samples": measured,
        "not_persisted": charged - count,
        "left_pending": left,
    }


class CommitObserver(threading.Thread):
    """Follows acknowledged deducts (id, ack ms) from a queue until it sees each row committed in t_order."""

    def __init__(self, acks):
        super().__init__(daemon=True)
        self.acks, self.outstanding, self.lags, self.handed_over = acks, {}, [], []
        self.load_done = threading.Event()
        self.drain_deadline = None

    def run(self) -> None:
        import pymysql

        from hotledger.config import settings

        cfg = settings()
        conn = pymysql.connect(
            host=cfg.db_host,
            port=cfg.db_port,
            user=cfg.db_user,
            password=cfg.db_password,
            database=cfg.db_name,
            autocommit=True,
        )
        with conn.cursor() as cur:
            while True:
                self._take_acks()
                if self.load_done.is_set():
                    if self.drain_deadline is None:
                        self.drain_deadline = time.monotonic() + DRAIN_S
                    if not self.outstanding or time.monotonic() > self.drain_deadline:
                        break
                ids = list(self.outstanding)
                asked = time.time() * 1000  # a row seen now was committed before this read began
                for i in range(0, len(ids), 2000):
                    part = ids[i : i + 2000]
                    cur.execute(f"SELECT id FROM t_order WHERE id IN ({','.join(['%s'] * len(part))})", part)
                    for (entry_id,) in cur.fetchall():
                        self.lags.append(asked - self.outstanding.pop(entry_id))
                time.sleep(POLL_S)
        conn.close()

    def _take_acks(self) -> None:
        while True:
            try:
                entry_id, acked = self.acks.get_nowait()
            except queue.Empty:
                return
            self.outstanding[entry_id] = acked
            self.handed_over.append(time.time() * 1000 - acked)


def lag_at(user_ids: list[int], procs: int, rate: int, seconds: float) -> dict:
    import multiprocessing as mp

    acks = mp.get_context("spawn").Queue()
    observer = CommitObserver(acks)
    observer.start()
    try:
        run = clients.deducts(procs, user_ids, seconds, rate_per_s=rate, acks=acks)
    finally:
        time.sleep(0.5)  # the queue's feeder threads hand over the last acks
        observer.load_done.set()
        observer.join(DRAIN_S + 30)
    lags = observer.lags
    return {
        "offered_per_s": rate,
        "achieved_per_s": stats.rate(run["ok"], *run["window"]),
        "p50_ms": stats.percentile(lags, 0.5, 1),
        "p99_ms": stats.percentile(lags, 0.99, 1),
        "max_ms": round(max(lags), 1) if lags else None,
        "samples": len(lags),
        "not_persisted": len(observer.outstanding),
        "failed": run["failed"],
        "late_s": run["late"],
        # how long an ack took to reach the observer (the queue between processes): were it long, the lag would
        # be over by as much
        "handover_p99_ms": stats.percentile(observer.handed_over, 0.99, 1),
    }


def persisting(user_ids: list[int], timeout_s: float = 180) -> None:
    """Wait until the pollers persist: a deduct on every account (so every partition) is committed."""
    from hotledger.dal import db

    lo, hi = min(user_ids), max(user_ids)
    charged = sum(gather(_charge_worker, [(user_ids,)], 120 + START_ALLOWANCE_S))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if db.query("SELECT COUNT(*) FROM t_order WHERE user_id BETWEEN %s AND %s", (lo, hi))[0][0] >= charged:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the pollers did not persist {charged} deducts in {timeout_s:.0f} s")


def lag_figures(env: dict, procs: int, rates: list[int], seconds: float, log_dir: Path) -> dict:
    """The local runtime's pollers (one process per partition of the run's topic) persisting as deducts come."""
    from hotledger.config import settings
    from infra import services

    cfg = settings()
    # a topic of its own: what earlier steps published is not this figure's work
    topic = f"{cfg.kafka_topic}.lag.{uuid.uuid4().hex[:6]}"
    services.ensure_topic(cfg.kafka_bootstrap, topic, services.LOCAL_PARTITIONS)
    user_ids = bulk_accounts(LAG_ACCOUNTS, 10**12)
    previous = os.environ["KAFKA_TOPIC"]
    os.environ["KAFKA_TOPIC"] = topic  # the spawned clients publish there
    proc = runtime({**env, "KAFKA_TOPIC": topic}, log_dir / "lag-runtime.log", "--no-api", "--no-schedules")
    try:
        persisting(user_ids)
        return {rate: lag_at(user_ids, procs, rate, seconds) for rate in rates}
    finally:
        os.environ["KAFKA_TOPIC"] = previous
        stop(proc)


def main() -> int:
    import harness

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--procs", type=int, default=8)
    args = parser.parse_args()
    from infra import services

    with harness.environment("hotledger_bench_writer") as (_cfg, _redis, state):
        env = {**os.environ}
        real_stdout = sys.stdout
        clients.quiet()
        rows = 2_000 if args.quick else 12_000
        result = {
            "1": writer_rows_per_s(env, args.procs, 1, rows, state),
            str(services.LOCAL_PARTITIONS): writer_rows_per_s(env, args.procs, services.LOCAL_PARTITIONS, rows, state),
            "lag": lag_figures(
                env, args.procs, [200] if args.quick else [200, 500, 1000], 4 if args.quick else 15, state
            ),
        }
        sys.stdout = real_stdout
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
