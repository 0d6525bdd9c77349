"""The hot voucher (issue 12): one flash sale's attempts/s sold from 1 stock bucket vs N buckets (each its own Redis
slot, so on a Redis Cluster its own shard), through the API handler, and `sharded_voucher_oversell` (must be 0): a
sale of N buckets hammered until sold out never answers more orders than its stock, nor leaves a bucket below 0.

Called by bench/run.py (`make bench`, on the run's private Redis), or on its own against any Redis, a Cluster's
configuration endpoint included (REDIS_URL and whatever else the service reads for it come from the environment):

    .venv/bin/python bench/hot_voucher.py --redis-url redis+cluster://127.0.0.1:7000 --shards 8 --procs 8 --seconds 10

or on a private 3-master Redis Cluster of its own (the cluster step of `make bench`, figures named cluster_*):

    nice -n 19 .venv/bin/python bench/hot_voucher.py --cluster --shards 8 --procs 4 --seconds 3 --quick
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import sale
from harness import Size
from workers import START_ALLOWANCE_S, gather


def _sale(call, stock: int, shards: int) -> str:
    now = int(time.time() * 1000)
    status, body = call(
        "POST",
        "/vouchers",
        {"title": "hot", "stock": stock, "begin_at": now - 1000, "end_at": now + 86_400_000, "stock_shards": shards},
    )
    assert status == 201, body
    return body["voucher_id"]


def attempts_per_s(call, procs: int, seconds: float, shards: int, first_user: int) -> tuple[float, int, float]:
    """Every attempt a new buyer; the stock never runs out, so every attempt takes a unit in its home bucket: the
    attempts/s, how many were refused (anything but 0 says the figure measured refusals, not sales) and how late the
    latest worker was for the window."""
    voucher_id = _sale(call, 10**7, shards)
    codes, late = sale.orders_window(
        voucher_id, procs, first_user, seconds, warmup=8.0
    )  # spawn and import, shared machine
    return round(sum(codes.values()) / seconds, 1), sum(n for code, n in codes.items() if code != 200), late


def oversell(call, procs: int, shards: int, stock: int, first_user: int) -> dict:
    """Buyers hammer a sale of `shards` buckets past its stock (the tail falls over between buckets)."""
    voucher_id = _sale(call, stock, shards)
    attempts = 2 * stock // procs + 1
    now = time.monotonic()
    codes = sale._merge(
        [
            codes
            for codes, _ in gather(
                sale._order_worker,
                [
                    ("kafka", voucher_id, first_user + 10_000_000 * i, now, now + sale.ATTEMPTS_BOUND_S, attempts)
                    for i in range(procs)
                ],
                sale.ATTEMPTS_BOUND_S + START_ALLOWANCE_S,
            )
        ]
    )
    view = call("GET", f"/vouchers/{voucher_id}", None)[1]
    sold = codes.get(200, 0)
    return {
        "sharded_voucher_orders": sold,
        "sharded_voucher_stock": stock,
        "sharded_voucher_oversell": max(0, sold - stock) + sum(max(0, -left) for left in view["bucket_stock_left"]),
        "sharded_voucher_unsold": sum(view["bucket_stock_left"]),
    }


def figures(call, procs: int, seconds: float, shards: int, size: Size) -> dict:
    one, one_refused, one_late = attempts_per_s(call, procs, seconds, 1, 400_000_000)
    many, many_refused, many_late = attempts_per_s(call, procs, seconds, shards, 500_000_000)
    result = {
        "hot_voucher_shards": shards,
        "hot_voucher_1_bucket_attempts_per_s": one,
        f"hot_voucher_{shards}_buckets_attempts_per_s": many,
        "hot_voucher_buckets_vs_1_ratio": round(many / max(one, 0.1), 2),
        "hot_voucher_attempts_refused": one_refused + many_refused,
        "hot_voucher_workers_late_s": round(max(one_late, many_late), 2),
    }
    result.update(oversell(call, procs, shards, size.pick(10_000, 2_000, 100), 600_000_000))
    return result


def on_cluster(call, cluster, procs: int, seconds: float, shards: int, size: Size) -> dict:
    """figures() with the service on a Redis Cluster (this process and the workers it spawns), named cluster_*, and
    how many of its masters the N buckets of a sale reached (by the buckets' hash tags: a spread, not a plan)."""
    from hotledger import keys, runtime

    previous = os.environ["REDIS_URL"]
    os.environ["REDIS_URL"] = cluster.url
    runtime.reset()  # settings and clients are read once per process: read REDIS_URL again
    try:
        result = figures(call, procs, seconds, shards, size)
        probe = int(_sale(call, shards, shards))
        result["hot_voucher_bucket_masters"] = len(
            {cluster.master_of(keys.voucher(probe, k)).port for k in range(shards)}
        )
    finally:
        os.environ["REDIS_URL"] = previous
        runtime.reset()
    return {f"cluster_{name}": value for name, value in result.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--redis-url", help="the Redis (or Redis Cluster configuration endpoint) to sell on")
    where.add_argument(
        "--cluster", action="store_true", help="sell on a private 3-master Redis Cluster, as make bench does"
    )
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    import clients
    import harness

    from hotledger import runtime

    # the DB schema and topic of a bench run (and a private Redis, unused with --redis-url or --cluster)
    with harness.environment() as (_, _, state):
        real_stdout = sys.stdout
        clients.quiet()
        if args.cluster:
            with harness.private_cluster(state) as cluster:
                result = on_cluster(
                    clients.api(), cluster, args.procs, args.seconds, args.shards, harness.Size.of(args.quick)
                )
        else:
            if args.redis_url:
                os.environ["REDIS_URL"] = args.redis_url
                runtime.reset()  # the run's settings were read with its private Redis
            result = figures(clients.api(), args.procs, args.seconds, args.shards, harness.Size.of(args.quick))
        sys.stdout = real_stdout
    print(json.dumps(result, indent=2))
    oversold = [name for name, value in result.items() if name.endswith("sharded_voucher_oversell") and value]
    return 1 if oversold else 0


if __name__ == "__main__":
    sys.exit(main())
