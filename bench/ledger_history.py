"""Issue 20's figures: holds on the hot path, history and balances at any depth of a long ledger.

- `hold_authorize_lua_p99_ms_1000_holds`: one authorize's hold_change.lua call round trip (client side, ms) on an account
  holding 1,000 live holds; `..._100_expired` with 100 expired ones the drainer has not tidied yet as well (the script
  leaves those out itself, reading each one's record); `deduct_lua_p99_ms_1000_holds` the same for ledger_apply.lua.
  Warm-up calls are left out.
- `deduct_script_vs_before_holds_ratio`: ledger_apply.lua calls/s now over the script as it was before holds
  (git show BEFORE_HOLDS), alternating rounds on one Redis and one client, an account without holds: what holds
  cost every deduct (target >= 0.95).
- `history_page_p99_ms_1m_entries`, `balance_at_p99_ms_1m_entries`: GET /accounts/{id}/entries (a page of 100 at a
  random depth, through the history service: the Redis pending tail and the DB page) and the balance at a random
  time, on an account with 1,000,000 booked entries (100,000 with --quick).

Called by bench/run.py; alone: PYTHONPATH=functions:. .venv/bin/python bench/ledger_history.py [--quick]
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE_HOLDS = "bf13b36"  # the last commit before issue 20 touched ledger_apply.lua


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _timed_ms(fn, samples: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def _funded_account(balance: int) -> int:
    from hotledger.ledger.feature import ledger

    ledger_ = ledger()
    user_id = ledger_.create_account(f"bench-{time.monotonic_ns()}", "ASYNC", 0)
    ledger_.load_cache(user_id)
    ledger_.store.update_cache(user_id, {"balance": balance})
    return user_id


def hold_figures(samples: int) -> dict:
    from hotledger.holds.feature import holds
    from hotledger.ledger.feature import ledger
    from hotledger.ledger.rows import Charge
    from hotledger.runtime import id_generator

    store, next_id = holds().store, id_generator().next_id
    user_id = _funded_account(10**13)
    now = int(time.time() * 1000)

    def authorize_ms() -> list[float]:
        return _timed_ms(
            lambda: store.authorize(
                user_id, next_id(), 1, int(time.time() * 1000), int(time.time() * 1000) + 3_600_000, ""
            ),
            samples,
            samples // 10,
        )

    def script_usec() -> tuple[int, int]:
        stats = store.redis.info("commandstats").get("cmdstat_evalsha", {})
        return stats.get("calls", 0), stats.get("usec", 0)

    for _ in range(1000):  # live
        store.authorize(user_id, next_id(), 100, now, now + 3_600_000, "bench")
    calls, usec = script_usec()
    authorize = authorize_ms()
    calls_after, usec_after = script_usec()
    for _ in range(100):  # expired, not tidied yet: every script leaves them out itself, one record read each
        store.authorize(user_id, next_id(), 100, now, now - 1, "bench")
    authorize_expired = authorize_ms()
    deduct = _timed_ms(
        lambda: ledger().store.apply(Charge("D", user_id, 1, next_id(), int(time.time() * 1000), None, "")),
        samples,
        samples // 10,
    )
    return {
        "hold_authorize_lua_p99_ms_1000_holds": round(_p(authorize, 0.99), 3),
        "hold_authorize_lua_p99_ms_1000_holds_100_expired": round(_p(authorize_expired, 0.99), 3),
        # inside Redis (INFO commandstats), without the round trip and the client
        "hold_authorize_redis_usec_per_call_1000_holds": round((usec_after - usec) / max(1, calls_after - calls), 1),
        "deduct_lua_p99_ms_1000_holds": round(_p(deduct, 0.99), 3),
        "_samples": {"holds": samples},
    }


def deduct_vs_before_holds(rounds: int, calls: int) -> float:
    """Calls/s of ledger_apply.lua now over the script before holds: alternating rounds, the median of each."""
    from hotledger import keys
    from hotledger.dal.redis_store import lua
    from hotledger.ledger.feature import ledger
    from hotledger.ledger.rows import Charge
    from hotledger.runtime import id_generator

    before = subprocess.run(
        ["git", "show", f"{BEFORE_HOLDS}:layers/lua/ledger_apply.lua"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    client = lua().client
    old = client.register_script(before)
    store, next_id = ledger().store, id_generator().next_id
    user_id = _funded_account(10**13)

    def now_apply():
        store.apply(Charge("D", user_id, 1, next_id(), int(time.time() * 1000), None, ""))

    def old_apply():
        entry_id, ts = next_id(), int(time.time() * 1000)
        old(
            keys=[
                keys.balance(user_id),
                keys.entry(user_id, entry_id),
                keys.pending(user_id),
                keys.idempotency(user_id, ""),
                keys.account_stream(user_id),
                keys.idempotency_quota(user_id),
                keys.held(user_id),
            ],
            args=["D", 1, ts, entry_id, 600, "", 86400, 9_000_000_000_000_000, ts, "", "", user_id, "", "", "", ""],
        )

    rates: dict[str, list[float]] = {"now": [], "before": []}
    for _ in range(rounds):
        for name, fn in (("now", now_apply), ("before", old_apply)):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            rates[name].append(calls / (time.perf_counter() - start))
    return round(statistics.median(rates["now"]) / statistics.median(rates["before"]), 3)


def history_figures(entries: int, samples: int) -> dict:
    from hotledger.dal import db
    from hotledger.history.feature import history
    from hotledger.history.service import Filters, encode_cursor

    user_id = _funded_account(0)
    base = int(time.time() * 1000) - entries * 10
    chunk = 50_000  # a statement each (MariaDB's sequence engine: no client loop), within the client's read timeout
    for first in range(1, entries + 1, chunk):
        with db.transaction() as cur:
            cur.execute(
                "INSERT INTO t_entry (user_id, seq, entry_id, type, amount, delta, balance_after, available_after,"
                " booked_at, charged_at, ref) SELECT %s, seq, %s + seq, 'recharge', 100, 100, seq * 100, seq * 100,"
                f" %s + seq * 10, %s + seq * 10, NULL FROM seq_{first}_to_{min(entries, first + chunk - 1)}",
                (user_id, user_id * 10**7, base, base),
            )
    with db.transaction() as cur:
        cur.execute("UPDATE t_account SET seq = %s, balance = %s WHERE user_id = %s", (entries, entries * 100, user_id))
    service, rng = history(), random.Random(7)
    page = _timed_ms(
        lambda: service.entries(user_id, 100, encode_cursor(user_id, rng.randint(2, entries), Filters()), None),
        samples,
        samples // 10,
    )
    at = _timed_ms(lambda: service.balance_at(user_id, base + rng.randint(0, entries * 10)), samples, samples // 10)
    return {
        "history_page_p99_ms_1m_entries": round(_p(page, 0.99), 3),
        "balance_at_p99_ms_1m_entries": round(_p(at, 0.99), 3),
        "_samples": {"history": samples, "entries": entries},
    }


def figures(size) -> dict:
    """The figures at `size` (harness.Size)."""
    holds = hold_figures(size.pick(2000, 500, 50))
    hist = history_figures(size.pick(1_000_000, 100_000, 2_000), size.pick(1000, 200, 20))
    return {
        "figures": {k: v for k, v in {**holds, **hist}.items() if not k.startswith("_")}
        | {
            "deduct_script_vs_before_holds_ratio": deduct_vs_before_holds(
                size.pick(7, 3, 1), size.pick(5000, 2000, 100)
            )
        },
        "targets": {
            "hold_authorize_lua_p99_ms_1000_holds": "<= 0.3",
            "history_page_p99_ms_1m_entries": "<= 50",
            "balance_at_p99_ms_1m_entries": "<= 20",
            "deduct_script_vs_before_holds_ratio": ">= 0.95",
        },
        "samples": {**holds["_samples"], **hist["_samples"]},
    }


if __name__ == "__main__":
    sys.path[:0] = [str(REPO / "functions"), str(REPO), str(REPO / "bench")]
    import harness

    with harness.environment("hotledger_bench_ledger"):
        print(json.dumps(figures(harness.Size.of("--quick" in sys.argv)), indent=2))
