"""The hot voucher (issue 12): one flash sale's attempts/s sold from 1 stock bucket vs N buckets (each its own Redis
slot, so on a Redis Cluster its own shard), through the API handler, and `sharded_voucher_oversell` (must be 0): a
sale of N buckets hammered until sold out never answers more orders than its stock, nor leaves a bucket below 0.

Called by bench/run.py (`make bench`, on the run's private Redis), or on its own against any Redis, a Cluster's
configuration endpoint included (REDIS_URL and whatever else the service reads for it come from the environment):

    .venv/bin/python bench/hot_voucher.py --redis-url redis://127.0.0.1:7000/0 --shards 8 --procs 8 --seconds 10
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import sale


def _sale(call, stock: int, shards: int) -> str:
    now = int(time.time() * 1000)
    status, body = call("POST", "/vouchers", {"title": "hot", "stock": stock, "begin_at": now - 1000,
                                              "end_at": now + 86_400_000, "stock_shards": shards})
    assert status == 201, body
    return body["voucher_id"]


def attempts_per_s(call, procs: int, seconds: float, shards: int, first_user: int) -> float:
    """Every attempt a new buyer; the stock never runs out, so every attempt takes a unit in its home bucket."""
    voucher_id = _sale(call, 10**7, shards)
    warmup = 8.0  # spawn and import (slow when the machine is shared)
    started = time.monotonic()
    codes = sale._merge(sale._spawn(sale._order_worker, [
        ("kafka", voucher_id, first_user + 10_000_000 * i, started + warmup + seconds, 10**9) for i in range(procs)]))
    return round(sum(codes.values()) / (time.monotonic() - started - warmup), 1)


def oversell(call, procs: int, shards: int, stock: int, first_user: int) -> dict:
    """Buyers hammer a sale of `shards` buckets past its stock (the tail falls over between buckets)."""
    voucher_id = _sale(call, stock, shards)
    attempts = 2 * stock // procs + 1
    codes = sale._merge(sale._spawn(sale._order_worker, [
        ("kafka", voucher_id, first_user + 10_000_000 * i, time.monotonic() + 600, attempts) for i in range(procs)]))
    view = call("GET", f"/vouchers/{voucher_id}", None)[1]
    sold = codes.get(200, 0)
    return {"sharded_voucher_orders": sold, "sharded_voucher_stock": stock,
            "sharded_voucher_oversell": max(0, sold - stock) + sum(max(0, -left) for left in view["bucket_stock_left"]),
            "sharded_voucher_unsold": sum(view["bucket_stock_left"])}


def figures(call, procs: int, seconds: float, shards: int, quick: bool) -> dict:
    one = attempts_per_s(call, procs, seconds, 1, 400_000_000)
    many = attempts_per_s(call, procs, seconds, shards, 500_000_000)
    result = {"hot_voucher_shards": shards, "hot_voucher_1_bucket_attempts_per_s": one,
              f"hot_voucher_{shards}_buckets_attempts_per_s": many,
              "hot_voucher_buckets_vs_1_ratio": round(many / max(one, 0.1), 2)}
    result.update(oversell(call, procs, shards, 2_000 if quick else 10_000, 600_000_000))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="the Redis (or Redis Cluster configuration endpoint) to sell on")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    import run

    with run.environment():  # the DB schema and topic of a bench run (and a private Redis, unused with --redis-url)
        if args.redis_url:
            os.environ["REDIS_URL"] = args.redis_url
        real_stdout = sys.stdout
        run._quiet()
        result = figures(run._api(), args.procs, args.seconds, args.shards, args.quick)
        sys.stdout = real_stdout
    print(json.dumps(result, indent=2))
    return 0 if result["sharded_voucher_oversell"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
