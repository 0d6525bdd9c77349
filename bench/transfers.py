"""Transfers (issue 34): figures, never assertions.

- ack: a transfer's answer time through the API handler (in process, one request at a time, paced at RATE per second,
  both ways between two hot accounts), p50 / p99 (ms);
- to POSTED: from the answer until GET /transfers/{id} says POSTED (both legs booked in the DB by the local
  runtime's writer), p50 / p99 (ms), read every 50 ms;
- transfers/s between two hot accounts against deducts/s on one account, same run, as fast as THREADS threads of this
  process go (a transfer is two charges, each acknowledged by the broker, and two DB row moves).

    PYTHONPATH=functions:. .venv/bin/python bench/transfers.py [--quick]
It starts its own Redis, DB schema and topic (bench/harness.py) and the local runtime without the API (the writer's
pollers and the scheduled functions); the machine's load moves these figures by tens of percent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def paced_transfers(call, a: int, b: int, rate: float, seconds: float) -> dict:
    acks: list[float] = []
    posted: list[float] = []
    outstanding: dict[str, float] = {}
    lock, done = threading.Lock(), threading.Event()

    def watch() -> None:
        while not done.is_set() or outstanding:
            with lock:
                ids = list(outstanding)
            for transfer_id in ids:
                status, body = call("GET", f"/transfers/{transfer_id}")
                if status == 200 and body["state"] == "POSTED":
                    with lock:
                        posted.append((time.time() - outstanding.pop(transfer_id)) * 1000)
            time.sleep(0.05)
            if done.is_set() and time.time() > done_at + 60:
                return

    done_at = 0.0
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stop_at, next_at, i, failed = time.time() + seconds, time.time(), 0, 0
    while time.time() < stop_at:
        next_at += 1 / rate
        pause = next_at - time.time()
        if pause > 0:
            time.sleep(pause)
        payer, payee = (a, b) if i % 2 == 0 else (b, a)
        i += 1
        started = time.time()
        status, body = call("POST", "/transfers", {"from": payer, "to": payee, "amount": "0.01"})
        ended = time.time()
        if status != 201:
            failed += 1
            continue
        acks.append((ended - started) * 1000)
        with lock:
            outstanding[body["transfer_id"]] = ended
    done_at = time.time()
    done.set()
    watcher.join(timeout=70)
    return {
        "rate_per_s": rate,
        "transfers": len(acks),
        "failed": failed,
        "ack_p50_ms": _pct(acks, 0.5),
        "ack_p99_ms": _pct(acks, 0.99),
        "to_posted_p50_ms": _pct(posted, 0.5),
        "to_posted_p99_ms": _pct(posted, 0.99),
        "not_posted": len(outstanding),
    }


def flat_out(call, threads: int, seconds: float, request) -> float:
    counts = [0] * threads
    stop_at = time.time() + seconds

    def work(n: int) -> None:
        i = 0
        while time.time() < stop_at:
            method, path, body = request(n, i)
            if call(method, path, body)[0] in (200, 201):
                counts[n] += 1
            i += 1

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return round(sum(counts) / seconds, 1)


def main() -> int:
    import clients
    import harness
    import writer_speed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rate", type=float, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    seconds = 4 if args.quick else 10
    with harness.environment("hotledger_bench_transfers") as (_cfg, _redis, state):
        real_stdout = sys.stdout
        clients.quiet()
        proc = writer_speed.runtime({**os.environ}, state / "runtime.log", "--no-api")
        try:
            call = clients.api()
            accounts = []
            for _ in range(3):
                status, body = call("POST", "/accounts", {"user_name": f"bench-t-{time.monotonic_ns()}"})
                accounts.append(body["user_id"])
                call("POST", f"/accounts/{body['user_id']}/recharge", {"amount": "1000000.00"})
            a, b, c = accounts
            paced = paced_transfers(call, a, b, args.rate, seconds)
            transfers_per_s = flat_out(
                call,
                args.threads,
                seconds,
                lambda n, i: (
                    "POST",
                    "/transfers",
                    {"from": a if (n + i) % 2 else b, "to": b if (n + i) % 2 else a, "amount": "0.01"},
                ),
            )
            deducts_per_s = flat_out(
                call, args.threads, seconds, lambda n, i: ("POST", f"/accounts/{c}/deduct", {"amount": "0.01"})
            )
        finally:
            writer_speed.stop(proc)
        sys.stdout = real_stdout
    print(
        json.dumps(
            {
                "paced": paced,
                "threads": args.threads,
                "transfers_per_s_two_hot_accounts": transfers_per_s,
                "deducts_per_s_one_account": deducts_per_s,
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
