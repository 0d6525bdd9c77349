"""hotledger benchmarks: figures, never assertions. Writes bench/results.json and prints a table.

Everything runs side by side in one run on this machine: a private Redis (its own port), the schema
`hotledger_bench`, a fresh topic of the local partitions on the configured broker. Usage (from the repo root, or `make bench`):
    PYTHONPATH=functions:. .venv/bin/python bench/run.py [--quick] [--procs N] [--seconds T]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from http.client import HTTPConnection
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "functions"), str(REPO), str(REPO / "bench")]

from infra import services  # noqa: E402
from infra.event_keys import local_keyring  # noqa: E402
from infra.migrate import migrate  # noqa: E402
from workers import START_ALLOWANCE_S, gather  # noqa: E402

import writer_speed  # noqa: E402

HOT_BALANCE = "90000000000.00"
TARGETS = {"async_vs_sync_hot_ratio": (">=", 5), "service_vs_evalsha_ratio": (">=", 0.2), "writer_rows_per_s": (">=", 50000),
           "writer_batch_vs_row_ratio": (">=", 10), "ack_to_db_lag_p99_ms": ("<=", 300), "redpacket_grabs_per_s": (">=", 40000),
           "seckill_oversell": ("<=", 0), "sharded_voucher_oversell": ("<=", 0),
           "cluster_sharded_voucher_oversell": ("<=", 0), "delay_remove_p99_ms_100k": ("<=", 0.5),
           "handler_vs_floor_cpu_ratio": ("<=", 1.5), "cluster_masters_used": (">=", 3),
           "cluster_getkeys_per_script_call": ("<=", 0)}


# --- in-process API invocations (the handler with API Gateway events, as Lambda runs it) -----------------
def _api():
    from api.app import handler

    from infra.localrt import events

    context = events.LambdaContext("ApiFunction")

    def call(method: str, path: str, body=None) -> tuple[int, dict]:
        response = handler(events.api_gateway_proxy(method, path, json.dumps(body) if body is not None else None,
                                                     authorizer=backend_caller()), context)
        return response["statusCode"], json.loads(response["body"])

    return call


def backend_caller() -> dict:
    """The caller the benchmarks act as: the backend with both scopes, as the authorizer passes it."""
    from infra import dev_issuer

    return dev_issuer.caller_context(None, ("service", "admin"))


def _quiet() -> None:
    """Workers print EMF lines per invocation; in a benchmark they only cost terminal time."""
    sys.stdout = open(os.devnull, "w")


def deduct_worker(user_ids: list[int], stop_at: float, rate_per_s: float, out) -> None:
    _quiet()
    call = _api()
    latencies, acks, i = [], [], 0
    next_at = time.monotonic()
    while time.monotonic() < stop_at:
        if rate_per_s:
            next_at += 1 / rate_per_s
            time.sleep(max(0.0, next_at - time.monotonic()))
        user_id = user_ids[i % len(user_ids)]
        i += 1
        started = time.perf_counter()
        status, body = call("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"})
        latencies.append((time.perf_counter() - started) * 1000)
        if status == 200:
            acks.append((int(body["order_id"]), time.time() * 1000))
    out.put((latencies, acks))


def run_workers(procs: int, user_ids: list[int], seconds: float, rate_per_s: float = 0) -> tuple[list[float], list]:
    stop_at = time.monotonic() + seconds + 3  # spawn and import take about a second
    results = gather(deduct_worker, [(user_ids, stop_at, rate_per_s / procs if rate_per_s else 0)] * procs,
                     seconds + 3 + START_ALLOWANCE_S)
    return [x for lat, _ in results for x in lat], [x for _, ack in results for x in ack]


def _pct(values: list[float], q: float) -> float:
    return round(statistics.quantiles(values, n=1000)[int(q * 1000) - 1], 2) if len(values) > 10 else float("nan")


def hot_account_throughput(call, procs: int, seconds: float, mode: str) -> dict:
    status, body = call("POST", "/accounts", {"user_name": f"hot-{mode}-{uuid.uuid4().hex[:8]}", "deduct_type": mode})
    user_id = body["user_id"]
    call("POST", f"/accounts/{user_id}/recharge", {"amount": HOT_BALANCE})
    started = time.time()
    latencies, acks = run_workers(procs, [user_id], seconds)
    window = [a for a in acks if a[1] / 1000 >= started + 3]  # only the measured window (after warm-up)
    return {"per_s": round(len(window) / seconds, 1), "p50_ms": _pct(latencies, 0.5), "p99_ms": _pct(latencies, 0.99)}


# --- raw Redis ceilings ------------------------------------------------------------------------------------
def evalsha_redis_benchmark(redis_port: int, clients: int, requests: int) -> float:
    from hotledger.dal.redis_store import lua as runner

    lua = runner()
    lua.run("ledger_load", ["user:balance:{777}", "user:held:{777}", "user:holds:{777}", "user:holds:expiry:{777}",
                                  "user:refunds:{777}"], [9_000_000_000_000_000 // 2, 1, 0, "1", "ASYNC", "bench", 0])
    sha = lua.sha("ledger_apply")
    lua.client.script_load((REPO / "layers/lua/ledger_apply.lua").read_text())
    cmd = ["redis-benchmark", "-p", str(redis_port), "-c", str(clients), "-n", str(requests), "-r", "1000000000", "-q",
           "evalsha", sha, "9", "user:balance:{777}", "user:order:{777}:__rand_int__", "user:order:consistency:{777}",
           "user:idem:{777}:", "events:unused:{777}", "user:idem:quota:{777}", "user:held:{777}", "user:holds:{777}",
           "user:holds:expiry:{777}",
           "D", "1", "1700000000000", "__rand_int__", "604800", "", "86400",
           "9000000000000000", "0", "", "", "777"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(re.findall(r"([\d.]+) requests per second", out)[-1])


def redispy_worker(stop_at: float, out) -> None:
    from hotledger.dal.redis_store import lua as runner

    lua, n = runner(), 0
    while time.monotonic() < stop_at:
        n += 1
        lua.run("ledger_apply", ["user:balance:{778}", f"user:order:{{778}}:{os.getpid()}-{n}", "user:order:consistency:{778}",
                                 "user:idem:{778}:", "events:unused:{778}", "user:idem:quota:{778}", "user:held:{778}",
                                 "user:holds:{778}", "user:holds:expiry:{778}"],
                ["D", 1, 1_700_000_000_000, f"{os.getpid()}{n}", 604800, "", 86400, 9_000_000_000_000_000, 0, "", "", 778])
    out.put(n)


def evalsha_redispy(procs: int, seconds: float) -> float:
    from hotledger.dal.redis_store import lua

    lua().run("ledger_load", ["user:balance:{778}", "user:held:{778}", "user:holds:{778}", "user:holds:expiry:{778}",
                                  "user:refunds:{778}"], [9_000_000_000_000_000 // 2, 1, 0, "1", "ASYNC", "bench", 0])
    stop_at = time.monotonic() + seconds + 1.5
    total = sum(gather(redispy_worker, [(stop_at,)] * procs, seconds + 1.5 + START_ALLOWANCE_S))
    return round(total / (seconds + 0.5), 1)  # workers start about a second late: a slight underestimate


# --- over the local HTTP port ------------------------------------------------------------------------------
def http_client(port: int, user_id: int, stop_at: float, threads: int, out) -> None:
    counts = [0] * threads
    body = json.dumps({"amount": "0.01"})
    from infra import dev_issuer

    headers = {"Content-Type": "application/json", "Authorization": "Bearer " + dev_issuer.token(scopes=("service",))}

    def loop(i: int) -> None:
        while time.monotonic() < stop_at:
            conn = HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", f"/accounts/{user_id}/deduct", body, headers)
            if conn.getresponse().status == 200:
                counts[i] += 1
            conn.close()

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(sum(counts))


def http_throughput(call, env: dict, procs: int, seconds: float, log_dir: Path) -> float:
    status, body = call("POST", "/accounts", {"user_name": f"http-{uuid.uuid4().hex[:8]}"})
    user_id = body["user_id"]
    call("POST", f"/accounts/{user_id}/recharge", {"amount": HOT_BALANCE})
    port = services.free_port()
    runtime = subprocess.Popen([sys.executable, "-m", "infra.localrt.runtime", "--port", str(port), "--no-msk", "--no-schedules"],
                               cwd=REPO, env={**env, "HOTLEDGER_API_WORKERS": str(procs)},
                               stdout=open(log_dir / "http-runtime.log", "wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not services.reachable("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # workers import the handler
        stop_at = time.monotonic() + seconds
        total = sum(gather(http_client, [(port, user_id, stop_at, 8)] * 2, seconds + START_ALLOWANCE_S))
        return round(total / seconds, 1)
    finally:
        runtime.terminate()
        runtime.wait()


# --- the writer ---------------------------------------------------------------------------------------------
def writer_throughput(call, rows: int, single_rows: int, accounts: int) -> dict:
    from hotledger.outbox.events import LedgerEvent
    from hotledger.runtime import id_generator, writer

    user_ids = [call("POST", "/accounts", {"user_name": f"w-{uuid.uuid4().hex[:10]}"})[1]["user_id"] for _ in range(accounts)]
    ids = id_generator()

    def events(n: int) -> list[LedgerEvent]:
        return [LedgerEvent(type="ledger", id=ids.next_id(), kind="R", user_id=user_ids[i % len(user_ids)], amount=100,
                            balance_after=100, version=i + 2, epoch="bench", ts=int(time.time() * 1000), open="1")
                for i in range(n)]

    batch_events, single_events, batch = events(rows), events(single_rows), writer_speed.template_batch_size()
    started = time.perf_counter()
    for i in range(0, rows, batch):
        writer().persist(batch_events[i:i + batch])
    batch_rate = rows / (time.perf_counter() - started)
    started = time.perf_counter()
    for event in single_events:
        writer().persist([event])
    single_rate = single_rows / (time.perf_counter() - started)
    return {"writer_persist_rows_per_s": round(batch_rate, 1), "writer_row_per_txn_per_s": round(single_rate, 1),
            "writer_batch_vs_row_ratio": round(batch_rate / single_rate, 2)}


def sale_figures(call, cfg, redis_port: int, args, seconds: float, env: dict, log_dir: Path) -> dict:
    import hot_voucher
    import sale

    figures = sale.seckill_service(call, args.procs, seconds, stock=5_000 if args.quick else 20_000)
    figures.update(hot_voucher.figures(call, args.procs, seconds, 4, args.quick))
    db = {"host": cfg.db_host, "port": cfg.db_port, "user": cfg.db_user, "password": cfg.db_password, "database": cfg.db_name}
    figures.update(sale.seckill_db_baseline(call, db, args.procs, seconds, stock=5_000 if args.quick else 20_000))
    figures["seckill_vs_db_ratio"] = round(figures["seckill_attempts_per_s"] / figures["seckill_db_locks_attempts_per_s"], 2)
    figures["seckill_script_per_s"] = sale.seckill_script(redis_port, args.procs, 50_000 if args.quick else 200_000)
    figures["seckill_script_vs_db_ratio"] = round(figures["seckill_script_per_s"] / figures["seckill_db_locks_attempts_per_s"], 2)
    figures.update(sale.redpacket_script(redis_port, 20, 100_000 if args.quick else 500_000))
    figures.update(sale.redpacket_service(call, args.procs, 400 if args.quick else 2_000))
    orders = 2_000 if args.quick else 10_000
    kafka = sale.transport_orders_per_s(env, "kafka", args.procs, orders, log_dir / "transport-kafka.log")
    stream = sale.transport_orders_per_s(env, "redis-stream", args.procs, orders, log_dir / "transport-stream.log")
    figures.update(kafka_orders_persisted_per_s=kafka, stream_orders_persisted_per_s=stream,
                   stream_vs_kafka_ratio=round(stream / kafka, 2))
    return figures


def delay_lock_figures(args, seconds: float) -> dict:
    import delay_lock

    from hotledger.runtime import lua as runner

    lua = runner()
    figures = delay_lock.delay_remove(lua.client, lua, 100_000, 2_000 if args.quick else 10_000, 50 if args.quick else 200)
    figures.update(delay_lock.delay_drain(lua.client, lua, 20_000 if args.quick else 100_000))
    figures.update(delay_lock.lock_figures(lua, args.procs, seconds))
    return figures


# the hot voucher's buckets on the 3-master cluster: 8 reach all 3 masters for most voucher ids (4 would in 64%)
CLUSTER_VOUCHER_SHARDS = 8


@contextlib.contextmanager
def private_cluster(state: Path):
    """A private 3-master Redis Cluster beside the run's Redis, stopped and removed after."""
    import cluster

    redis_cluster = cluster.start(state / "redis-cluster")
    try:
        yield redis_cluster
    finally:
        redis_cluster.stop()
        shutil.rmtree(state / "redis-cluster", ignore_errors=True)


def cluster_figures(call, redis_server, args, seconds: float, state: Path) -> dict:
    """On a private Redis Cluster: per-script Redis CPU on it and on the run's Redis, the keys' spread, and the hot
    voucher's 1 bucket vs N buckets through the handler."""
    import cluster
    import hot_voucher

    with private_cluster(state) as redis_cluster:
        figures = cluster.figures(redis_server, redis_cluster, args.quick)
        figures.update(hot_voucher.on_cluster(call, redis_cluster, args.procs, seconds, CLUSTER_VOUCHER_SHARDS, args.quick))
    return figures


@contextlib.contextmanager
def environment(schema: str = "hotledger_bench"):
    """The run's servers: a private Redis, its own schema (dropped and made again), a fresh topic of the local
    partitions (MariaDB and the broker are started when absent). Yields (settings, the Redis server, the run's state
    dir); stops the Redis after."""
    run_id = uuid.uuid4().hex[:8]
    state = services.STATE / f"bench-{run_id}"
    redis_server = services.RedisServer(services.free_port(), state / "redis").start()
    os.environ.update({"REDIS_URL": redis_server.url, "DB_NAME": schema, "KAFKA_TOPIC": f"hotledger.bench.{run_id}",
                       "LOG_LEVEL": "WARNING", "POWERTOOLS_METRICS_NAMESPACE": "HotledgerBench",
                       # the CPU benchmarks charge hot accounts with no writer running: no pending bound for them
                       "MAX_PENDING_ENTRIES": "0"})
    # the service signs every event it publishes: the dev keyring, as the local runtime uses it
    if not (os.environ.get("EVENT_KEYS") or os.environ.get("EVENT_KEYS_SECRET_ARN")):
        os.environ["EVENT_KEYS"] = local_keyring()
    from hotledger.config import settings

    cfg = settings()
    services.ensure_mariadb(cfg.db_host, cfg.db_port, cfg.db_user, cfg.db_password)
    host, port = cfg.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    services.ensure_broker(host, int(port))
    services.ensure_topic(cfg.kafka_bootstrap, cfg.kafka_topic, services.LOCAL_PARTITIONS)
    import pymysql

    conn = pymysql.connect(host=cfg.db_host, port=cfg.db_port, user=cfg.db_user, password=cfg.db_password)
    conn.cursor().execute(f"DROP DATABASE IF EXISTS `{schema}`")
    conn.close()
    migrate(cfg.db_host, cfg.db_port, cfg.db_user, cfg.db_password, schema)
    try:
        yield cfg, redis_server, state
    finally:
        redis_server.stop()
        shutil.rmtree(state / "redis", ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (about a minute in all)")
    parser.add_argument("--procs", type=int, default=8, help="client concurrency: worker processes / redis-benchmark clients")
    parser.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args()
    seconds = args.seconds or (3 if args.quick else 10)
    with environment() as (cfg, redis_server, state):
        import hotpath

        full_env = {**os.environ}
        real_stdout = sys.stdout
        _quiet()
        call = _api()
        figures: dict = {}
        asyn = hot_account_throughput(call, args.procs, seconds, "ASYNC")
        sync = hot_account_throughput(call, args.procs, seconds, "SYNC")
        figures.update(async_deduct_per_s=asyn["per_s"], sync_deduct_per_s=sync["per_s"],
                       async_vs_sync_hot_ratio=round(asyn["per_s"] / max(sync["per_s"], 0.1), 2),
                       async_deduct_p50_ms=asyn["p50_ms"], async_deduct_p99_ms=asyn["p99_ms"],
                       sync_deduct_p50_ms=sync["p50_ms"], sync_deduct_p99_ms=sync["p99_ms"])
        figures.update(hotpath.figures(call, 1_000 if args.quick else 5_000))
        figures["evalsha_per_s"] = evalsha_redis_benchmark(redis_server.port, args.procs, 50_000 if args.quick else 200_000)
        figures["redispy_evalsha_per_s"] = evalsha_redispy(args.procs, seconds)
        figures["service_vs_evalsha_ratio"] = round(figures["async_deduct_per_s"] / figures["evalsha_per_s"], 4)
        figures["http_deduct_per_s"] = http_throughput(call, full_env, args.procs, seconds, state)
        figures.update(writer_throughput(call, 5_000 if args.quick else 20_000, 500 if args.quick else 2_000, 200))
        figures["writer_persist_rows_per_s_20_accounts"] = writer_throughput(call, 5_000 if args.quick else 20_000, 100, 20)["writer_persist_rows_per_s"]
        figures.update(writer_speed.figures(call, run_workers, _pct, full_env, args.procs, args.quick, state))
        figures.update(sale_figures(call, cfg, redis_server.port, args, seconds, full_env, state))
        figures.update(delay_lock_figures(args, seconds))
        figures.update(cluster_figures(call, redis_server, args, seconds, state))
        sys.stdout = real_stdout
    results = {
        "figures": figures,
        "targets": {name: {"target": f"{op} {value}", "met": (figures[name] >= value) if op == ">=" else (figures[name] <= value)}
                    for name, (op, value) in TARGETS.items()},
        "bound_by": BOUND_BY,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "client_concurrency": args.procs, "seconds_per_run": seconds, "quick": args.quick,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (REPO / "bench" / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    return 0


BOUND_BY = {
    "async_deduct_per_s": "CPU: about 1.1 ms of CPU per deduct on 2 cores: the handler process 0.75-0.8 ms (Powertools "
                          "resolve, validation, logging and metrics ~0.5 ms, redis-py EVALSHA ~0.13 ms, confluent-kafka "
                          "send+ack ~0.12 ms), the broker ~0.23 ms, Redis ~0.1 ms; one request in flight per process, as in Lambda",
    "handler_cpu_us_per_deduct": "one warm in-process ASYNC deduct through api.app.handler: the floor's work plus the "
                                 "ledger service's own code and Powertools (resolve and its OpenAPI validation middleware, "
                                 "Logger context, Metrics and the EMF line); bench/hotpath.py --profile N shows where",
    "floor_cpu_us_per_deduct": "json.loads of the event, one EVALSHA via redis-py, produce + wait for the ack, json.dumps "
                               "of the answer: what no handler can skip; both figures count librdkafka's threads too",
    "handler_vs_floor_cpu_ratio": "Powertools' per-request cost dominates the rest: its validation middleware alone "
                                  "(path, query, header and cookie passes, body model, response) is about as much as "
                                  "the resolver, Logger and Metrics together; medians of alternating 100-deduct chunks",
    "handler_cpu_us_per_recharge": "one warm in-process ASYNC recharge through api.app.handler, in the same alternating "
                                   "chunks: a deduct's work plus posting the credit's hold after the ack (ledger_post.lua)",
    "recharge_vs_deduct_cpu_ratio": "what holding a credit until it is durable adds to a recharge: one more script call "
                                    "(the deduct checks balance - held in the same HMGET it made before)",
    "sync_deduct_per_s": "the hot row: lock + transaction + commit (fsync) serialize every deduct of one account",
    "evalsha_per_s": "Redis single thread running the script; the physical ceiling",
    "http_deduct_per_s": "the same CPU as in-process plus HTTP parsing and a TCP connection per request",
    "writer_rows_per_s": "one writer process per partition (6) side by side, each its partition's batches of the template's "
                         "BatchSize (accounts split among them), 20 batches each: the writer's handler on MSK events, so "
                         "JSON decode, the event model and the MAC check (over the record's own bytes) count; then one "
                         "transaction and the settle scripts, one per account (single-slot, Cluster-safe), pipelined. "
                         "The 2 cores are the bound: writer_rows_per_s_1_writer is the same work in one process",
    "writer_persist_rows_per_s": "the persister alone (no decode), one process, batches over 200 accounts",
    "writer_persist_rows_per_s_20_accounts": "as above with 20 accounts per batch: fewer per-account Redis scripts",
    "writer_row_per_txn_per_s": "a commit (fsync) and four round trips per row",
    "ack_to_db_lag_p99_ms": "the local runtime's pollers, one process per partition, each delivering its partition's records "
                            "as they come (50 ms collection, window 0 s): the fetch wait plus one small batch transaction; "
                            "on 2 cores the pollers and the clients share the CPU, so fewer deducts are achieved than asked",
    "achieved_deducts_per_s": "the same CPU bound as async_deduct_per_s, with the writer and the broker busy too",
    "seckill_attempts_per_s": "CPU of the handler processes, as for deducts; sold-out attempts skip the publish",
    "seckill_db_locks_attempts_per_s": "the voucher row lock: every attempt holds it through a commit (fsync)",
    "redpacket_grabs_per_s": "one round trip per grab (redis-benchmark, 20 clients, as the seed measured): Redis's "
                             "single thread and redis-benchmark share the 2 cores; pipelined, the script itself goes faster",
    "seckill_vs_db_ratio": "the service figure carries the whole Lambda handler (Powertools, publish + ack) per attempt; "
                           "the DB baseline is bare pymysql: seckill_script_vs_db_ratio compares the two mechanisms alone",
    "redpacket_service_grabs_per_s": "per grab: account check, grab script, claim publish, then the credit (a recharge with "
                                     "its own publish): about twice a deduct's work",
    "cluster_masters_used": "60 accounts, 60 vouchers and 60 packets, each its own hash tag: CRC16 places them on the "
                            "masters, so the spread is the hash's, not a plan (cluster_script_calls_per_master)",
    "cluster_hot_voucher_buckets_vs_1_ratio": "the hot voucher through the handler on the private 3-master cluster, 1 "
                                              "bucket vs N (cluster_hot_voucher_bucket_masters of the 3 reached): the "
                                              "handler processes, the broker's acks and the three Redis processes share "
                                              "2 cores, so one master's thread is not what a sale waits on here: the "
                                              "ratio moves with the machine's load, both ways, not with the buckets "
                                              "(an attempt costs the same in either). Buckets move a sale's script calls "
                                              "off one master; that scales only where masters and clients have CPUs of "
                                              "their own, which this machine cannot show",
    "cluster_sharded_voucher_oversell": "N buckets on different masters hammered past their stock: orders answered "
                                        "beyond the stock plus units any bucket sold below 0; must be 0",
    "ledger_apply_redis_usec_per_call_single": "INFO commandstats usec of EVALSHA over its calls, this script's workload "
                                               "alone (pipelines of 200); the cluster figure sums the masters' deltas",
    "stream_vs_kafka_ratio": "end to end incl. persisting; the stream transport saves the publish round trip and the broker",
    "delay_remove_p99_ms_100k": "one EVALSHA round trip from redis-py: ZREM of the element itself is O(log n)",
    "redisson_remove_p99_ms_100k": "the list scan: LINDEX + struct.unpack over up to 100,000 entries, O(n)",
    "delay_drain_per_s": "batches of 500 taken in one script each, then one ZREM to acknowledge",
    "delay_fire_lateness_p99_ms": "the drainer sleeps until the earliest due time (woken by offers that publish an earlier one); "
                                  "the rest is a round trip and Python's timer",
    "lock_contended_acquire_release_per_s": "8 processes on one lock holding it 1 ms each: every release wakes all "
                                            "waiters (one pub/sub message), one wins",
}


def print_table(results: dict) -> None:
    print(f"\nhotledger bench ({'quick' if results['quick'] else 'full'}; {results['client_concurrency']} clients; "
          f"{results['machine']['cpus']} CPUs)")
    print(f"{'figure':34} {'value':>12}  target")
    for name, value in results["figures"].items():
        target = results["targets"].get(name)
        verdict = f"{target['target']} ({'met' if target['met'] else 'NOT met'})" if target else ""
        print(f"{name:34} {value!s:>12}  {verdict}")
    print("\nwritten to bench/results.json")


if __name__ == "__main__":
    sys.exit(main())
