"""The lean hot path: CPU per warm ASYNC deduct through the API handler against a floor measured in the same run.

handler: the Lambda handler (api.app.handler) with an API Gateway REST proxy event, in process, one request at a
time, as one Lambda container runs it: the runtime's json.loads of the event, the handler, json.dumps of its answer.
floor: only the work no handler can skip: json.loads of the same event and its body, the same EVALSHA of
ledger_apply through redis-py (same KEYS/ARGV shape), the same produce + wait for the broker's ack
(hotledger.dal.publisher.publish), json.dumps of an answer of the same shape.
Both count time.process_time(): the CPU of every thread of this process (librdkafka's too), not the broker's or Redis's.

    PYTHONPATH=functions:. .venv/bin/python bench/hotpath.py [--quick] [--profile N]
(`make bench` runs it as part of bench/run.py; alone it starts the same servers and prints the figures.)
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "functions"), str(REPO), str(REPO / "bench")]

from infra import dev_issuer  # noqa: E402
from infra.localrt import events  # noqa: E402

BALANCE = "90000000000.00"
WARM_UP = 300


def _deduct_events(user_id: int, n: int, amount: str = "0.01", route: str = "deduct") -> list[str]:
    """The invocation payloads as the Lambda runtime receives them (JSON text), built before the clock starts."""
    backend = dev_issuer.caller_context(None, ("service",))  # what the authorizer passes for the backend's token
    return [json.dumps(events.api_gateway_proxy("POST", f"/accounts/{user_id}/{route}", json.dumps({"amount": amount}),
                                                {"Content-Type": "application/json"}, authorizer=backend)) for _ in range(n)]


def _hot_account(call) -> int:
    status, body = call("POST", "/accounts", {"user_name": f"hotpath-{uuid.uuid4().hex[:8]}"})
    user_id = body["user_id"]
    assert call("POST", f"/accounts/{user_id}/recharge", {"amount": BALANCE})[0] == 200
    return user_id


def handler_loop(payloads: list[str]) -> float:
    """CPU seconds for invoking the handler once per payload."""
    from api.app import handler

    context = events.LambdaContext("ApiFunction")
    started = time.process_time()
    for payload in payloads:
        response = handler(json.loads(payload), context)
        json.dumps(response)
    spent = time.process_time() - started
    assert response["statusCode"] == 200, response
    return spent


def floor_loop(user_id: int, payloads: list[str]) -> float:
    """CPU seconds for the bare work of the same deducts: parse, EVALSHA, produce + ack, serialize."""
    from hotledger import keys
    from hotledger.dal.publisher import publish
    from hotledger.dal.redis_store import lua as runner

    lua = runner()
    client, sha = lua.client, lua.sha("ledger_apply")
    balance, consistency = keys.balance(user_id), keys.pending(user_id)
    idem, stream, quota = keys.idempotency(user_id, ""), keys.account_stream(user_id), keys.idempotency_quota(user_id)
    held, holds, hold_expiry = keys.held(user_id), keys.holds(user_id), keys.hold_expiry(user_id)
    next_id = int(time.time() * 1000) << 22  # ids above any the handler's generator hands out in this run
    started = time.process_time()
    for payload in payloads:
        event = json.loads(payload)
        amount = 1 if json.loads(event["body"])["amount"] == "0.01" else 0
        next_id += 1
        ts = int(time.time() * 1000)
        status, entry_id, balance_after, version, epoch, open_flag = client.evalsha(
            sha, 9, balance, keys.entry(user_id, next_id), consistency, idem, stream, quota, held, holds, hold_expiry,
            "D", amount, ts, next_id, 604800, "", 86400, 9_000_000_000_000_000, ts - 15000, "", "", user_id)
        publish(str(user_id), {"type": "ledger", "id": next_id, "kind": "D", "user_id": user_id, "amount": amount,
                               "balance_after": int(balance_after), "version": int(version), "epoch": epoch.decode(),
                               "ts": ts, "open": open_flag.decode(), "idem_key": None})
        json.dumps({"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps(
            {"order_id": str(next_id), "user_id": user_id, "amount": "0.01", "balance": str(balance_after), "version": int(version),
             "mode": "ASYNC"})})
    spent = time.process_time() - started
    assert status == b"ok", status
    return spent


def figures(call, deducts: int, chunk: int = 100) -> dict:
    """handler_cpu_us_per_deduct, floor_cpu_us_per_deduct and their ratio; handler_cpu_us_per_recharge and its ratio
    to the deduct (a recharge also posts its held credit after the ack: ledger_post.lua). The loops alternate in
    chunks and each figure is the median over its chunks: the bench shares its cores with Redis, the broker and
    whatever else runs, and a chunk the scheduler disturbed must not move the figure."""
    user_id = _hot_account(call)
    handler_loop(_deduct_events(user_id, WARM_UP))
    handler_loop(_deduct_events(user_id, WARM_UP, route="recharge"))
    floor_loop(user_id, _deduct_events(user_id, WARM_UP))
    handler_us, floor_us, recharge_us = [], [], []
    for _ in range(max(1, deducts // chunk)):
        handler_us.append(handler_loop(_deduct_events(user_id, chunk)) / chunk * 1e6)
        floor_us.append(floor_loop(user_id, _deduct_events(user_id, chunk)) / chunk * 1e6)
        recharge_us.append(handler_loop(_deduct_events(user_id, chunk, route="recharge")) / chunk * 1e6)
    handler, floor, recharge = statistics.median(handler_us), statistics.median(floor_us), statistics.median(recharge_us)
    return {"handler_cpu_us_per_deduct": round(handler, 1), "floor_cpu_us_per_deduct": round(floor, 1),
            "handler_vs_floor_cpu_ratio": round(handler / floor, 2),
            "handler_cpu_us_per_recharge": round(recharge, 1), "recharge_vs_deduct_cpu_ratio": round(recharge / handler, 2)}


def profile(call, deducts: int, top: int) -> None:
    """cProfile the warm handler loop: the functions with the most cumulative and own time, per deduct."""
    user_id = _hot_account(call)
    handler_loop(_deduct_events(user_id, WARM_UP))
    payloads = _deduct_events(user_id, deducts)
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    handler_loop(payloads)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 deducts per loop instead of 5,000")
    parser.add_argument("--deducts", type=int, default=None)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="also cProfile the handler loop: top N to stderr")
    args = parser.parse_args()
    deducts = args.deducts or (1_000 if args.quick else 5_000)
    import run

    with run.environment():
        real_stdout = sys.stdout
        run.clients.quiet()  # the handler prints its EMF metrics line per invocation
        call = run.clients.api()
        found = figures(call, deducts)
        if args.profile:
            profile(call, deducts, args.profile)
        sys.stdout = real_stdout
    target = run.TARGETS["handler_vs_floor_cpu_ratio"]
    for name, value in found.items():
        print(f"{name:30} {value:>10}")
    print(f"target: handler_vs_floor_cpu_ratio {target[0]} {target[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
