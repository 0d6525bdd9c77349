"""hotledger benchmarks: figures, never assertions. Writes bench/results.json, PNG charts beside it, and prints a table.

Every stage runs on servers of its own on this machine: a private Redis (its own port), the schema
`hotledger_bench_<id>` (dropped after), a fresh topic of the local partitions on the configured broker. Every
figure is counted in its measured window only (workers spawned, imported and warmed up before it opens), names its baseline measured in the
same run, its unit and its sample count; the run records its commit and the machine's load before and after. One
progress line per stage goes to stderr. Usage (from the repo root, or `make bench`):
    PYTHONPATH=functions:. .venv/bin/python bench/run.py [--quick | --smoke] [--procs N] [--seconds T] [--only N,..]
--smoke (make bench-smoke, in make test) runs every stage once at a tiny size, judges no target and writes its figures
to .state/bench-smoke/ instead; it exits 1 when a stage failed. A run of some stages (--only) or a --quick one writes
to .state/bench-partial/: bench/results.json is the last full run's, and a full run that failed no stage writes
docs/performance.md's figures from it (bench/perfdoc.py). Each stage runs on a Redis, schema and topic of its own
so none starts from what an earlier one left.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "functions"), str(REPO), str(REPO / "bench")]

import clients  # noqa: E402
import perfdoc  # noqa: E402
import report  # noqa: E402
import stats  # noqa: E402
from harness import LAG_RATES, TARGETS, Size, environment, private_cluster  # noqa: E402
from workers import START_ALLOWANCE_S, gather  # noqa: E402

from infra import services  # noqa: E402

HOT_BALANCE = "90000000000.00"
SMOKE_OUT = services.STATE / "bench-smoke" / "results.json"
# a run of some stages, or a quick one, is not the run of record: bench/results.json and the doc stay the full run's
PARTIAL_OUT = services.STATE / "bench-partial" / "results.json"
# figure -> the figure it is compared with (measured in the same run); a ratio's baseline is its denominator
BASELINES = {
    "async_deduct_per_s": "sync_deduct_baseline_per_s",
    "async_vs_sync_hot_ratio": "sync_deduct_baseline_per_s",
    "sync_deduct_per_s": "db_deduct_per_s",
    "sync_vs_lean_ratio": "db_deduct_per_s",
    "redispy_evalsha_per_s": "evalsha_per_s",
    "handler_cpu_us_per_deduct": "floor_cpu_us_per_deduct",
    "handler_vs_floor_cpu_ratio": "floor_cpu_us_per_deduct",
    "handler_cpu_us_per_deduct_without_hiredis": "floor_cpu_us_per_deduct_without_hiredis",
    "handler_vs_floor_cpu_ratio_without_hiredis": "floor_cpu_us_per_deduct_without_hiredis",
    "handler_vs_floor_cpu_ratio_without_log_and_emf_lines": "floor_cpu_us_per_deduct",
    "handler_instructions_per_deduct": "floor_instructions_per_deduct",
    "handler_instructions_per_deduct_without_log_and_emf_lines": "floor_instructions_per_deduct",
    "service_instructions_per_deduct": "floor_instructions_per_deduct",
    "handler_vs_floor_instructions_ratio": "floor_instructions_per_deduct",
    "handler_cpu_us_per_recharge": "handler_cpu_us_per_deduct",
    "recharge_vs_deduct_cpu_ratio": "handler_cpu_us_per_deduct",
    "writer_rows_per_s": "writer_rows_per_s_1_partition",
    "writer_partitions_vs_1_ratio": "writer_rows_per_s_1_partition",
    "writer_vs_api_deduct_ratio": "async_deduct_per_s",
    "writer_vs_api_rows_per_cpu_s_ratio": "async_deduct_per_cpu_s",
    "seckill_attempts_per_s": "seckill_db_attempts_per_s",
    "seckill_vs_db_ratio": "seckill_db_attempts_per_s",
    "redpacket_grabs_per_s": "redpacket_seed_script_grabs_per_s",
    "redpacket_vs_seed_script_ratio": "redpacket_seed_script_grabs_per_s",
    "stream_orders_persisted_per_s": "kafka_orders_persisted_per_s",
    "stream_vs_kafka_ratio": "kafka_orders_persisted_per_s",
    "hot_voucher_buckets_vs_1_ratio": "hot_voucher_1_bucket_attempts_per_s",
    "cluster_hot_voucher_buckets_vs_1_ratio": "cluster_hot_voucher_1_bucket_attempts_per_s",
    "delay_remove_p99_ms_100k": "redisson_remove_p99_ms_100k",
    "delay_remove_p50_ms_100k": "redisson_remove_p50_ms_100k",
    "delay_remove_vs_redisson_ratio": "redisson_remove_p99_ms_100k",
    "lock_contended_acquire_release_per_s": "spin_lock_contended_acquire_release_per_s",
    "lock_commands_per_contended_acquire": "spin_lock_commands_per_contended_acquire",
    **{
        f"{s}_cluster_vs_single_cpu_ratio": f"{s}_redis_usec_per_call_single"
        for s in ("ledger_apply", "voucher_order", "redpacket_grab")
    },
    **{
        f"{s}_redis_usec_per_call_cluster": f"{s}_redis_usec_per_call_single"
        for s in ("ledger_apply", "voucher_order", "redpacket_grab")
    },
}


def shown(path: Path) -> str:
    """A path as the repo names it when it is inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def unit_of(name: str) -> str:
    for suffix, unit in (
        ("_per_s", "1/s"),
        ("_ms", "ms"),
        ("_ms_100k", "ms"),
        ("_ratio", "ratio"),
        ("_late_s", "s"),
        ("_usec_per_call_single", "µs"),
        ("_usec_per_call_cluster", "µs"),
        ("_us_per_deduct", "µs"),
        ("_instructions_per_deduct", "instructions"),
        ("_instructions_per_deduct_without_log_and_emf_lines", "instructions"),
        ("_us_per_deduct_without_hiredis", "µs"),
        ("_ratio_without_hiredis", "ratio"),
        ("_ratio_without_log_and_emf_lines", "ratio"),
        ("_us_per_recharge", "µs"),
        ("_bytes", "B"),
        ("_usd", "USD"),
    ):
        if name.endswith(suffix):
            return unit
    if "_per_s_" in name:
        return "1/s"
    return "count"


def add_all(figures: report.Figures, found: dict, samples: int | None = None, measures: str = "") -> None:
    for name, value in found.items():
        figures.add(name, value, unit_of(name), samples=samples, baseline=BASELINES.get(name), measures=measures)


# --- the hot account: ASYNC against the SYNC path and the lean DB baseline, all behind the same handler -----------
def hot_account(call, procs: int, seconds: float, mode: str, baseline: str | None = None) -> dict:
    status, body = call("POST", "/accounts", {"user_name": f"hot-{mode}-{uuid.uuid4().hex[:8]}", "deduct_type": mode})
    user_id = body["user_id"]
    assert call("POST", f"/accounts/{user_id}/recharge", {"amount": HOT_BALANCE})[0] == 200
    run = clients.deducts(procs, [user_id], seconds, baseline=baseline)
    return {
        "per_s": stats.rate(run["ok"], *run["window"]),
        "ok": run["ok"],
        "failed": run["failed"],
        "p50_ms": stats.percentile(run["latencies"], 0.5),
        "p99_ms": stats.percentile(run["latencies"], 0.99),
        "samples": len(run["latencies"]),
        "late_s": run["late"],
        "per_cpu_s": stats.ratio(run["ok"], run["cpu_s"], 1),
    }


def hot_account_figures(figures: report.Figures, call, procs: int, seconds: float) -> None:
    runs = {
        "async": hot_account(call, procs, seconds, "ASYNC"),
        "sync": hot_account(call, procs, seconds, "SYNC"),
        "db": hot_account(call, procs, seconds, "SYNC", baseline="deduct"),
    }
    what = {
        "async": "ASYNC deducts of one hot account through api.app.handler in-process (publish + broker ack)",
        "sync": "SYNC deducts of one hot account through the same handler: the product's DB path (the row lock "
        "alone: one transaction of two round trips)",
        "db": "lean SYNC baseline: the same handler, the deduct one DB round trip (a stored procedure: row lock, "
        "entry, commit; bench/baselines.py)",
    }
    for key, run in runs.items():
        name = {"async": "async_deduct", "sync": "sync_deduct", "db": "db_deduct"}[key]
        figures.add(f"{name}_per_s", run["per_s"], "1/s", run["ok"], BASELINES.get(f"{name}_per_s"), what[key])
        figures.add(f"{name}_p50_ms", run["p50_ms"], "ms", run["samples"], None, what[key])
        figures.add(f"{name}_p99_ms", run["p99_ms"], "ms", run["samples"], None, what[key])
    figures.add(
        "async_deduct_per_cpu_s",
        runs["async"]["per_cpu_s"],
        "1/s",
        runs["async"]["ok"],
        None,
        "async_deduct_per_s's deducts over the CPU seconds its worker processes used in the window (the handler, and "
        "the in-process caller's event building around it; not Redis's or the broker's)",
    )
    figures.add(
        "sync_vs_lean_ratio",
        stats.ratio(runs["sync"]["per_s"], runs["db"]["per_s"]),
        "ratio",
        None,
        "db_deduct_per_s",
        "the product's SYNC deduct over the lean one-round-trip DB baseline, behind the same handler (issue 33 goal 3)",
    )
    best = max(("sync", "db"), key=lambda k: runs[k]["per_s"])
    figures.add(
        "sync_deduct_baseline_per_s",
        runs[best]["per_s"],
        "1/s",
        runs[best]["ok"],
        None,
        f"the better of the SYNC path and the lean DB baseline: here {'sync_deduct_per_s' if best == 'sync' else 'db_deduct_per_s'}",
    )
    figures.add(
        "async_vs_sync_hot_ratio",
        stats.ratio(runs["async"]["per_s"], runs[best]["per_s"]),
        "ratio",
        None,
        "sync_deduct_baseline_per_s",
        "ASYNC over the best SYNC baseline",
    )
    figures.add(
        "hot_account_failed_requests",
        sum(r["failed"] for r in runs.values()),
        "count",
        None,
        None,
        "answers other than 200 in the three windows",
    )
    figures.add(
        "hot_account_workers_late_s",
        max(r["late_s"] for r in runs.values()),
        "s",
        None,
        None,
        "how late the latest worker was for its window (more than 0: that rate is low)",
    )


# --- raw Redis ceilings ------------------------------------------------------------------------------------
# the ceilings' accounts, cached in Redis alone: ids the DB's AUTO_INCREMENT does not reach in a run. (They were 777
# and 778 while every stage shared one Redis and schema: the writer stage's accounts then got those ids from the DB,
# and the ~300,000 entries the ceilings left pending under them, never published, kept its 1-partition wait to its
# 300 s deadline: 36.9 rows/s in issue 33.)
EVALSHA_USER, REDISPY_USER = 9_000_000_777, 9_000_000_778
# redis-benchmark puts a random 12-digit number where its command line says __rand_int__: the entry id here
RAND_ENTRY_ID = 987_654_321_987


def evalsha_redis_benchmark(redis_port: int, clients: int, requests: int) -> float:
    import scripts

    from hotledger.dal.redis_store import lua as runner
    from hotledger.dal.redis_store import script_text

    lua = runner()
    scripts.load(lua, EVALSHA_USER, 9_000_000_000_000_000 // 2)
    name, keys, args = scripts.deduct_call(lua, EVALSHA_USER, RAND_ENTRY_ID)
    line = [str(x).replace(str(RAND_ENTRY_ID), "__rand_int__") for x in (*keys, *args)]
    sha = lua.sha(name)
    lua.client.script_load(script_text(REPO / f"layers/lua/{name}.lua"))
    cmd = ["redis-benchmark", "-p", str(redis_port), "-c", str(clients), "-n", str(requests), "-r", "1000000000"]
    cmd += ["-q", "evalsha", sha, str(len(keys)), *line]
    balance_before = int(lua.client.hget(keys[0], "balance"))
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    charged = balance_before - int(lua.client.hget(keys[0], "balance"))
    if charged < requests * 0.99:  # redis-benchmark counts error replies as requests too
        raise RuntimeError(f"redis-benchmark's ledger_apply charged {charged} of {requests}: {out[-2000:]}")
    return float(re.findall(r"([\d.]+) requests per second", out)[-1])


def redispy_worker(start_at: float, stop_at: float, out) -> None:
    import scripts

    from hotledger.dal.redis_store import lua as runner
    from hotledger.ledger.replies import ApplyStatus

    store, n, counted = scripts.store(runner()), 0, 0
    while (now := time.monotonic()) < stop_at:
        n += 1
        reply = store.apply(scripts.deduct(REDISPY_USER, os.getpid() * 10**9 + n))
        if reply.status is not ApplyStatus.OK:
            raise RuntimeError(f"ledger_apply answered {reply}")
        counted += now >= start_at
    out.put(counted)


def evalsha_redispy(procs: int, seconds: float) -> tuple[float, int]:
    import scripts

    from hotledger.dal.redis_store import lua

    scripts.load(lua(), REDISPY_USER, 9_000_000_000_000_000 // 2)
    start_at = time.monotonic() + 5  # spawned and imported
    total = sum(gather(redispy_worker, [(start_at, start_at + seconds)] * procs, 5 + seconds + START_ALLOWANCE_S))
    return round(total / seconds, 1), total


def ceiling_figures(figures: report.Figures, redis_port: int, procs: int, size: Size, seconds: float) -> None:
    requests = size.pick(200_000, 50_000, 2_000)
    figures.add(
        "evalsha_per_s",
        evalsha_redis_benchmark(redis_port, procs, requests),
        "1/s",
        requests,
        None,
        "ledger_apply.lua alone from redis-benchmark (C), one round trip each: Redis's ceiling for the script",
    )
    per_s, calls = evalsha_redispy(procs, seconds)
    figures.add(
        "redispy_evalsha_per_s",
        per_s,
        "1/s",
        calls,
        "evalsha_per_s",
        "the same script from redis-py, one process per client: what Python clients get of the ceiling",
    )


# --- the writer and the lag, latency over HTTP ---------------------------------------------------------------
def writer_figures(figures: report.Figures, env: dict, procs: int, size: Size, state: Path) -> dict:
    import writer_speed

    rows = size.pick(12_000, 3_000, 200)
    one = writer_speed.writer_rows_per_s(env, procs, 1, rows, state)
    many = writer_speed.writer_rows_per_s(env, procs, services.LOCAL_PARTITIONS, rows, state)
    what = (
        f"{rows} ASYNC deducts, one account each, charged through the handler onto a topic of N partitions, then "
        "read by the local runtime's pollers, persisted and settled: from the first rows committed to the last "
        "entry settled"
    )
    figures.add("writer_rows_per_s_1_partition", one["per_s"], "1/s", one["samples"], None, what + " (N = 1)")
    figures.add(
        "writer_rows_per_s",
        many["per_s"],
        "1/s",
        many["samples"],
        "writer_rows_per_s_1_partition",
        what + f" (N = {services.LOCAL_PARTITIONS}, in total)",
    )
    figures.add(
        "writer_rows_per_s_per_partition",
        many["per_partition_per_s"],
        "1/s",
        many["samples"],
        "writer_rows_per_s_1_partition",
        f"writer_rows_per_s over its {services.LOCAL_PARTITIONS} partitions",
    )
    figures.add(
        "writer_rows_per_cpu_s",
        many["per_cpu_s"],
        "1/s",
        many["samples"],
        None,
        f"writer_rows_per_s's rows (N = {services.LOCAL_PARTITIONS}) over the CPU seconds the local runtime's processes "
        "used in the same window (the pollers, each with its partition's writer; not Redis's, the DB's or the "
        "broker's)",
    )
    figures.add(
        "writer_partitions_vs_1_ratio",
        stats.ratio(many["per_s"], one["per_s"]),
        "ratio",
        None,
        "writer_rows_per_s_1_partition",
        "the same work on N partitions against 1",
    )
    figures.add(
        "writer_not_persisted",
        one["not_persisted"] + many["not_persisted"],
        "count",
        2 * rows,
        None,
        "charged rows not in the DB when the wait ended (must be 0)",
    )
    figures.add(
        "writer_left_pending",
        one["left_pending"] + many["left_pending"],
        "count",
        2 * rows,
        None,
        "entries still pending in Redis when the wait ended (must be 0)",
    )
    return {"1": one, str(services.LOCAL_PARTITIONS): many}


def lag_figures(figures: report.Figures, env: dict, procs: int, size: Size, state: Path) -> dict:
    import writer_speed

    rates = size.pick(LAG_RATES, LAG_RATES[:2], LAG_RATES[:1])
    found = writer_speed.lag_figures(env, procs, list(rates), size.pick(15, 4, 1), state)
    what = (
        "deducts over 100 accounts paced at the offered rate (in-process handler calls), persisted by the local "
        "runtime's pollers as they come: ack to the row seen committed (an upper bound, at most "
        f"{writer_speed.POLL_S * 1000:.0f} ms over)"
    )
    for rate, lag in found.items():
        figures.add(
            f"achieved_deducts_per_s_at_{rate}_per_s",
            lag["achieved_per_s"],
            "1/s",
            lag["samples"],
            None,
            f"acknowledged deducts in the window when {rate}/s were offered",
        )
        figures.add(f"ack_to_commit_lag_p50_ms_at_{rate}_per_s", lag["p50_ms"], "ms", lag["samples"], None, what)
        figures.add(f"ack_to_commit_lag_p99_ms_at_{rate}_per_s", lag["p99_ms"], "ms", lag["samples"], None, what)
        figures.add(
            f"lag_not_persisted_at_{rate}_per_s",
            lag["not_persisted"],
            "count",
            lag["samples"] + lag["not_persisted"],
            None,
            f"acknowledged deducts not seen committed {writer_speed.DRAIN_S:.0f} s after the load ended (must be 0)",
        )
    return found


def latency_figures(figures: report.Figures, call, env: dict, procs: int, size: Size, state: Path) -> dict:
    import latency

    rates = size.pick([100, 200, 400, 800], [100, 300], [50])
    seconds = size.pick(8, 3, 1)
    found = latency.figures(call, env, procs, rates, seconds, state)
    for route, result in found.items():
        figures.add(
            f"http_{route}_knee_offered_per_s",
            result["knee_offered_per_s"],
            "1/s",
            sum(s["samples"] for s in result["steps"]),
            None,
            f"the lowest offered rate (of {rates}) whose p99 passed {latency.KNEE_MS:.0f} ms over HTTP, open loop; "
            "None: none did",
        )
        low = result["steps"][0]
        figures.add(
            f"http_{route}_p99_ms_at_{rates[0]}_per_s",
            low["p99_ms"],
            "ms",
            low["samples"],
            None,
            f"p99 over HTTP at {rates[0]} offered/s (open loop, from when each request was due)",
        )
        figures.add(
            f"http_{route}_errors",
            sum(s["errors"] for s in result["steps"]),
            "count",
            sum(s["samples"] + s["errors"] for s in result["steps"]),
            None,
            "non-2xx, refused or timed out, all steps",
        )
    return found


# --- flash sales, red packets, transports -------------------------------------------------------------------
def sale_figures(figures: report.Figures, call, redis_port: int, procs: int, size: Size, seconds: float) -> None:
    import hot_voucher
    import sale

    service, db = sale.seckill_service(call, procs, seconds), sale.seckill_db(call, procs, seconds)
    figures.add(
        "seckill_attempts_per_s",
        service["attempts_per_s"],
        "1/s",
        service["attempts"],
        "seckill_db_attempts_per_s",
        "voucher orders through the handler, a new buyer each, on a stock that outlasts the window",
    )
    figures.add(
        "seckill_db_attempts_per_s",
        db["attempts_per_s"],
        "1/s",
        db["attempts"],
        None,
        "the same sale behind the same handler, each order one DB round trip holding the row lock through its "
        "commit (bench/baselines.py)",
    )
    figures.add(
        "seckill_vs_db_ratio",
        stats.ratio(service["attempts_per_s"], db["attempts_per_s"]),
        "ratio",
        None,
        "seckill_db_attempts_per_s",
        "like clients with like: the same handler processes on both sides",
    )
    figures.add(
        "seckill_attempts_refused",
        service["refused"] + db["refused"],
        "count",
        service["attempts"] + db["attempts"],
        None,
        "attempts answered other than 200 in either window (the stock outlasts them: must be 0)",
    )
    figures.add(
        "seckill_workers_late_s",
        max(service["late_s"], db["late_s"]),
        "s",
        None,
        None,
        "how late the latest worker was for its window",
    )
    stock = size.pick(10_000, 2_000, 100)
    sold = hot_voucher.oversell(call, procs, 1, stock, 700_000_000)
    figures.add(
        "seckill_oversell",
        sold["sharded_voucher_oversell"],
        "count",
        sold["sharded_voucher_orders"],
        None,
        f"a one-bucket sale of {stock} hammered with twice as many attempts: orders past the stock plus stock "
        "below 0 (must be 0)",
    )
    figures.add(
        "seckill_unsold",
        sold["sharded_voucher_unsold"],
        "count",
        stock,
        None,
        "units left when the hammering ended (must be 0: the sale sold out, so the oversell figure could fail)",
    )
    requests = size.pick(200_000, 50_000, 2_000)
    figures.add(
        "seckill_script_per_s",
        sale.seckill_script(redis_port, procs, requests),
        "1/s",
        requests,
        None,
        "voucher_order.lua alone from redis-benchmark: Redis's ceiling for the script, no baseline",
    )
    grabs = size.pick(500_000, 100_000, 2_000)
    add_all(
        figures,
        sale.redpacket_script(redis_port, 20, grabs),
        samples=grabs,
        measures="grab scripts from redis-benchmark, 20 clients: ours against the seed's script, same client",
    )
    add_all(
        figures,
        sale.redpacket_service(call, procs, size.pick(2_000, 400, 20)),
        measures="grabs through the handler (account check, grab, claim publish, credit), over the workers' union span",
    )
    add_all(
        figures,
        hot_voucher.figures(call, procs, seconds, 4, size),
        measures="one voucher's sale over 1 vs N stock buckets through the handler (bench/hot_voucher.py)",
    )


def transport_figures(figures: report.Figures, procs: int, size: Size, env: dict, state: Path) -> None:
    import sale

    orders = size.pick(10_000, 2_000, 100)
    kafka = sale.transport_orders_per_s(env, "kafka", procs, orders, state / "transport-kafka.log")
    stream = sale.transport_orders_per_s(env, "redis-stream", procs, orders, state / "transport-stream.log")
    what = f"{orders} voucher orders end to end: from the workers' start to the last one in the DB"
    figures.add("kafka_orders_persisted_per_s", kafka, "1/s", orders, None, what + " (MSK pollers)")
    figures.add(
        "stream_orders_persisted_per_s",
        stream,
        "1/s",
        orders,
        "kafka_orders_persisted_per_s",
        what + " (Redis Streams)",
    )
    figures.add("stream_vs_kafka_ratio", stats.ratio(stream, kafka), "ratio", None, "kafka_orders_persisted_per_s", "")


def delay_lock_figures(figures: report.Figures, procs: int, size: Size, seconds: float) -> None:
    import delay_lock

    from hotledger.runtime import lua as runner

    lua = runner()
    removes = size.pick(10_000, 2_000, 100)
    add_all(
        figures,
        delay_lock.delay_remove(lua.client, lua, size.pick(100_000, 100_000, 2_000), removes, size.pick(200, 50, 10)),
        samples=removes,
        measures="remove a random element of a 100,000-element queue: ours vs a Redisson re-implementation",
    )
    drained = size.pick(100_000, 20_000, 1_000)
    add_all(
        figures,
        delay_lock.delay_drain(lua.client, lua, drained),
        samples=drained,
        measures="drain (take 500 per script, acknowledge), then lateness of 2,000 elements due over 4 s",
    )
    add_all(figures, delay_lock.lock_figures(lua, procs, seconds))


# the hot voucher's buckets on the 3-master cluster: 8 reach all 3 masters for most voucher ids (4 would in 64%)
CLUSTER_VOUCHER_SHARDS = 8


def cluster_figures(
    figures: report.Figures, call, redis_server, procs: int, size: Size, seconds: float, state: Path
) -> None:
    """On a private Redis Cluster: per-script Redis CPU on it and on the run's Redis, the key lookups a pipelined
    script costs, and the hot voucher's 1 bucket vs N buckets through the handler."""
    import cluster
    import hot_voucher

    with private_cluster(state) as redis_cluster:
        add_all(
            figures,
            cluster.figures(redis_server, redis_cluster, size),
            measures="INFO commandstats EVALSHA usec over calls, each script's workload alone, pipelines of 200",
        )
        add_all(
            figures,
            hot_voucher.on_cluster(call, redis_cluster, procs, seconds, CLUSTER_VOUCHER_SHARDS, size),
            measures="the hot voucher through the handler on a private 3-master cluster",
        )


def memory_figures(figures: report.Figures, size: Size, state: Path) -> dict:
    import memory

    n = size.pick(100_000, 20_000, 1_000)
    server = services.RedisServer(services.free_port(), state / "redis-memory").start()
    try:
        found = memory.figures(server.client(), n)
    finally:
        server.stop()
    for entity, size in found.items():
        figures.add(
            f"memory_{entity}_bytes",
            size["bytes"],
            "B",
            n,
            None,
            f"INFO used_memory delta over {n:,} of them on an empty Redis, per {entity.replace('_', ' ')}",
        )
    return found


def ledger_history_figures(figures: report.Figures, size: Size) -> None:
    import ledger_history

    found = ledger_history.figures(size)
    measures = ledger_history.__doc__.split("\n\n")[0]
    for name, value in found["figures"].items():
        unit = "ratio" if name.endswith("_ratio") else "us" if "_usec_" in name else "ms"
        samples = found["samples"].get("holds" if "lua" in name else "history")
        figures.add(
            name,
            value,
            unit,
            None if name.endswith("_ratio") else samples,
            "deduct script before holds (git show)" if name.endswith("_ratio") else None,
            measures,
        )


def webhook_figures(figures: report.Figures, size: Size) -> None:
    import webhooks

    found = webhooks.figures(size)
    samples = found.pop("_samples")
    measures = webhooks.__doc__.split("\n\n")[0]
    baselines = {
        "webhook_events_per_s": "bare_posts_per_s",
        "webhook_backlog_drain_per_s": "bare_posts_per_s",
        "webhook_1m_backlog_drain_per_s": "bare_posts_per_s",
        "webhook_delivery_lag_p99_ms_beside_blackhole": "webhook_delivery_lag_p99_ms_alone",
        "monitor_check_us_per_booked_entry": "monitor_check_us_per_booked_entry_without_monitors",
    }
    for name, value in found.items():
        unit = (
            "1/s"
            if name.endswith("_per_s")
            else "ms"
            if name.endswith("_ms") or "_ms_" in name
            else "us"
            if "_us_" in name
            else "count"
        )
        figures.add(name, value, unit, samples.get(name), baselines.get(name), measures)


def ceiling_figures_server_side(figures: report.Figures, redis_port: int, size: Size, state: Path) -> None:
    """Issue 33 goal 2: one account's deducts where they are serialized, from C clients (bench/ceiling.py)."""
    import ceiling

    for name, (value, unit, samples, baseline, measures) in ceiling.figures(redis_port, state, size).items():
        figures.add(name, value, unit, samples, baseline, measures)


def hotpath_figures(figures: report.Figures, extra: dict, size: Size) -> None:
    import hotpath

    deducts = size.pick(5_000, 1_000, 100)
    counted_deducts = size.pick(hotpath.INSTRUCTIONS_DEDUCTS, hotpath.INSTRUCTIONS_DEDUCTS, 20)
    found = hotpath.all_figures(deducts, counted=counted_deducts)
    extra["handler_breakdown_us"] = found.pop("handler_breakdown_us")
    counted = {name: found.pop(name) for name in list(found) if "_instructions_" in name}
    without_lines = found.pop("handler_vs_floor_cpu_ratio_without_log_and_emf_lines")
    what = "per warm in-process deduct at the template's settings: the handler against a floor doing only the unskippable work"
    add_all(figures, found, samples=deducts, measures=f"CPU {what}")
    add_all(
        figures,
        {"handler_vs_floor_cpu_ratio_without_log_and_emf_lines": without_lines},
        samples=hotpath.without_lines_rounds(deducts) * hotpath.WITHOUT_LINES_CHUNK,
        measures=f"CPU {what}, with the charge's INFO line and the EMF line switched off (median of paired rounds)",
    )
    add_all(
        figures,
        counted,
        samples=counted_deducts,
        measures=f"instructions (valgrind's cachegrind, each loop in a fresh process less the setup's) {what}",
    )


def writer_vs_api_figures(figures: report.Figures) -> None:
    """Issue 33 goal 5, once the run measured both sides (stages 2 and 5): the writer's rows/s through the broker over
    the API's ASYNC deducts/s, and the same per CPU-second of each side's own processes (on 2 shared cores both share
    the CPU; on AWS each Lambda has its own)."""
    found = figures.values()
    for name, writer, api, measures in (
        (
            "writer_vs_api_deduct_ratio",
            "writer_rows_per_s",
            "async_deduct_per_s",
            "the writer's rows/s through the broker over the API handler's ASYNC deducts/s of one hot account, same run",
        ),
        (
            "writer_vs_api_rows_per_cpu_s_ratio",
            "writer_rows_per_cpu_s",
            "async_deduct_per_cpu_s",
            "the writer's rows per CPU-second of its processes over the API handler's deducts per CPU-second of its own",
        ),
    ):
        if writer in found and api in found:
            figures.add(name, stats.ratio(found[writer], found[api]), "ratio", None, BASELINES[name], measures)


# the hot path's CPU first: counted in one process, it reads best on a machine no earlier stage has just loaded
STAGES = [
    "hot path CPU",
    "hot account: ASYNC, SYNC and the lean DB baseline",
    "Redis ceilings",
    "latency over HTTP",
    "writer on its real path",
    "ack to commit lag",
    "flash sale and red packets",
    "transports",
    "delay queue and lock",
    "Redis Cluster",
    "memory per entity",
    "holds and history",
    "webhooks and balance monitors",
    "cost and plots",
    "hot account ceiling, server side",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="short runs (a few minutes in all)")
    sizes.add_argument(
        "--smoke",
        action="store_true",
        help="every stage once at a tiny size (seconds each; make bench-smoke, in make test): no target judged, "
        f"written to {shown(SMOKE_OUT)}; exits 1 when a stage failed",
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=None,
        help="client concurrency: worker processes / redis-benchmark clients (8; 2 with --smoke)",
    )
    parser.add_argument("--seconds", type=float, default=None, help="each throughput window")
    parser.add_argument("--out", type=Path, default=None, help="the results file (charts beside it)")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated stage numbers to run (developing a stage): "
        + "; ".join(f"{i} {name}" for i, name in enumerate(STAGES, 1)),
    )
    args = parser.parse_args()
    size = Size.of(args.quick, args.smoke)
    only = {int(n) for n in args.only.split(",") if n}
    seconds = args.seconds or size.pick(10, 3, 1)
    procs = args.procs or size.pick(8, 8, 2)
    full = size.name == "full" and not only
    out = args.out or (SMOKE_OUT if size.smoke else perfdoc.RESULTS if full else PARTIAL_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine_before = report.machine()
    progress = report.Progress(len(only) if only else len(STAGES))
    figures = report.Figures()
    extra: dict = {}
    real_stdout = sys.stdout

    def cost_and_plots(_: Stage) -> None:
        import cost

        written = figures.entries.get("writer_rows_per_s_per_partition", {}).get("value")
        function = cost.measured(size.pick(cost.MEASURED_DEDUCTS, cost.MEASURED_DEDUCTS, 20))
        extra["cost"] = cost.figures(function, written)
        prices = f"bench/cost.py, list prices of {cost.PRICES_AS_OF}"
        peer = "peer_cost_per_million_deduct_usd"
        figures.add(
            peer,
            extra["cost"]["peer_deduct"]["total"],
            "USD",
            None,
            None,
            f"request-driven AWS cost of a deduct built the usual way: API Gateway REST + Lambda + DynamoDB transaction ({prices})",
        )
        default_door = cost.default_front_door()
        for front_door in cost.FRONT_DOORS:
            suffix = "" if front_door == default_door else f"_{front_door}_front_door"
            for route in cost.WORK:
                figures.add(
                    f"cost_per_million_{route}{suffix}_usd",
                    extra["cost"][front_door][route]["total"],
                    "USD",
                    None,
                    peer if route == "deduct" else None,
                    f"request-driven AWS cost, FrontDoor {front_door}, the function's duration from the deduct's"
                    f" measured CPU ({prices})",
                )
        for front_door, measured in function.items():
            figures.add(
                f"api_function_log_bytes_per_deduct_{front_door}_front_door",
                measured["log_bytes"],
                "count",
                None,
                None,
                "bytes of the log and EMF lines the API function prints per warm deduct (bench/cost.py)",
            )

    steps = [
        lambda st: hotpath_figures(figures, extra, size),
        lambda st: hot_account_figures(figures, st.call, procs, seconds),
        lambda st: ceiling_figures(figures, st.redis_server.port, procs, size, seconds),
        lambda st: extra.update(latency=latency_figures(figures, st.call, st.env, procs, size, st.state)),
        lambda st: extra.update(writer=writer_figures(figures, st.env, procs, size, st.state)),
        lambda st: extra.update(lag=lag_figures(figures, st.env, procs, size, st.state)),
        lambda st: sale_figures(figures, st.call, st.redis_server.port, procs, size, seconds),
        lambda st: transport_figures(figures, procs, size, st.env, st.state),
        lambda st: delay_lock_figures(figures, procs, size, seconds),
        lambda st: cluster_figures(figures, st.call, st.redis_server, procs, size, seconds, st.state),
        lambda st: extra.update(memory=memory_figures(figures, size, st.state)),
        lambda st: ledger_history_figures(figures, size),
        lambda st: webhook_figures(figures, size),
        cost_and_plots,
        lambda st: ceiling_figures_server_side(figures, st.redis_server.port, size, st.state),
    ]
    failed: dict[str, str] = {}
    clients.quiet()  # before the handler's logger is made: it writes to the stdout it found (Lambda's, for nobody)
    for number, (name, step) in enumerate(zip(STAGES, steps, strict=True), 1):
        if only and number not in only:
            continue
        progress.stage(name)
        try:
            with stage_environment() as stage:
                step(stage)
        except Exception:
            failed[name] = traceback.format_exc()
            print(f"bench: stage {number} ({name}) failed:\n{failed[name]}", file=sys.stderr, flush=True)
            if not size.smoke:
                sys.stdout = real_stdout
                raise
    sys.stdout = real_stdout
    writer_vs_api_figures(figures)
    machine = {
        **machine_before,
        "load_average_before": machine_before.pop("load_average"),
        "load_average_after": list(os.getloadavg()),
    }
    machine.pop("load_average", None)
    values = figures.values()
    results = {
        "command": " ".join(["bench/run.py", *sys.argv[1:]]),
        "stages_run": sorted(only) if only else "all",
        "stages_failed": sorted(failed),
        **report.commit(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
        "client_concurrency": procs,
        "seconds_per_window": seconds,
        "size": size.name,
        "quick": size.name == "quick",
        # a smoke pass's sizes are too small for any figure to mean anything: nothing is judged
        "targets": {} if size.smoke else report.target_verdicts(values, TARGETS),
        "figures": figures.entries,
        **extra,
    }
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    import plots

    results["plots"] = [shown(p) for p in plots.write(results, out.parent)]
    results["stage_seconds"] = progress.finish()
    results["stage_load_at_start"] = progress.load_at_start
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_table(results, out)
    if full and not failed and out == perfdoc.RESULTS:
        perfdoc.write(results)
        print(f"{shown(perfdoc.DOC)} written from this run", file=sys.stderr)
    if failed:
        print(f"\nbench: {len(failed)} stage(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


@dataclasses.dataclass
class Stage:
    """What a stage runs on: the run's servers, made for it alone (stage_environment)."""

    call: object
    redis_server: services.RedisServer
    state: Path
    env: dict


@contextlib.contextmanager
def stage_environment():
    """Each stage on a state no earlier stage left: a Redis, a DB schema and a topic of its own (harness.environment),
    this process's services and DB connection made anew for them, the DB baselines' procedures installed, and an
    in-process API caller."""
    import baselines

    from hotledger import runtime
    from hotledger.dal import db

    with environment() as (_cfg, redis_server, state):
        runtime.reset()  # settings and clients are read once per process: read the stage's servers
        db._drop_connection()  # the last stage's schema is gone
        baselines.install()  # the DB baselines' stored procedures, in the stage's schema
        env = {**os.environ}
        try:
            yield Stage(clients.api(), redis_server, state, env)
        finally:
            runtime.reset()
            db._drop_connection()


def print_table(results: dict, out: Path) -> None:
    machine = results["machine"]
    print(
        f"\nhotledger bench ({results['size']}; {results['client_concurrency']} clients; "
        f"{machine['cpus']} CPUs; load {machine['load_average_before'][0]:.2f} -> {machine['load_average_after'][0]:.2f}; "
        f"commit {(results['commit'] or '')[:10]}{' +changes' if results['dirty'] else ''})"
    )
    print(f"{'figure':46} {'value':>12} {'unit':>6} {'samples':>8}  baseline / target")
    for name, entry in results["figures"].items():
        target = results["targets"].get(name)
        notes = [entry["baseline"] or ""]
        if target:
            notes.append(f"{target['target']} ({'met' if target['met'] else 'NOT met'})")
        print(
            f"{name:46} {entry['value']!s:>12} {entry['unit']:>6} {entry['samples'] if entry['samples'] is not None else '':>8}  "
            f"{' '.join(n for n in notes if n)}"
        )
    print(f"\nwritten to {shown(out)}" + "".join(f", {p}" for p in results.get("plots", [])))


if __name__ == "__main__":
    sys.exit(main())
