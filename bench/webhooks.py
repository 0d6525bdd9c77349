"""Issue 21's figures: webhooks and balance monitors.

- `webhook_events_per_s`: deliveries one sender (`Webhooks.send_due`, as WebhookSenderFunction runs it) signs, sends
  and records per second to a local receiver that answers 204 at once; baseline `bare_posts_per_s`: the same bodies
  POSTed to the same receiver from one thread with nothing else (no signing, no DB). Events booked beforehand by SYNC
  deducts (each writes its delivery row in the booking transaction).
- `webhook_backlog_drain_per_s`: a backlog of `BACKLOG` PENDING deliveries of `BACKLOG_ACCOUNTS` accounts (booked by
  SYNC deducts while no sender ran) drained by one `send_due` to the same kind of receiver, events/s from its start
  to the last one delivered; baseline `bare_posts_per_s`. Each pass sends every account's run of due deliveries in
  order (before: one delivery per account per pass, each pass scanning the whole backlog).
- `webhook_delivery_lag_p50_ms` / `_p99_ms` at `WEBHOOK_LAG_RATE` deducts/s: from a SYNC deduct's answer (booked
  when it answers) to the receiver's 200, with the sender running as the function runs it (looking again every
  50 ms when idle). An ASYNC charge adds the writer's lag (`ack_to_commit_lag_*` figures). Goal p99 <= 2,000 ms.
- `webhook_due_ms_1m_backlog` / `webhook_due_ms_10k_backlog` (issue 32 item 11): the median time of one look at what
  is due (`WebhookStore.due`, 200 at most) while a failing endpoint holds that many PENDING deliveries (100 per
  account, every account's first one backing off: none due) beside a healthy endpoint with 10 due; their ratio,
  `webhook_due_backlog_ratio`, goal <= 1.5: a look reads the due heads (`t_webhook_head`) and their runs, not the
  backlog. The backlog is written straight into the tables (`--quick`: 10k against 100k).
- `monitor_check_us_per_booked_entry`: what judging balance monitors adds to booking one entry (`monitors.store.judge`
  in the booking transaction, accounts with one monitor each), against `..._without_monitors` (the same rows,
  accounts with none). The deduct script itself does not change with monitors: they are judged where the entry is
  booked, so a crossing is a durable fact.

Called by bench/run.py; alone: PYTHONPATH=functions:. .venv/bin/python bench/webhooks.py [--quick]
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WEBHOOK_LAG_RATE = 20  # deducts per second while the lag is measured
BACKLOG, BACKLOG_ACCOUNTS = 5_000, 3  # the backlog drained, of how many accounts


class _Receiver:
    """A local endpoint answering 204 at once; records when each event_id first arrived (monotonic seconds)."""

    def __init__(self):
        self.arrived: dict[str, float] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                event_id = self.headers.get("webhook-id") or json.loads(body)["data"]["event_id"]
                receiver.arrived.setdefault(event_id, time.monotonic())
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@contextlib.contextmanager
def _endpoint(description: str) -> Iterator[tuple[Any, _Receiver]]:
    """The service's webhooks with an endpoint for charge.persisted at a local receiver; both gone after."""
    from hotledger.webhooks.feature import webhooks

    hooks = webhooks()
    hooks.allow_local = True
    receiver = _Receiver()
    endpoint, _ = hooks.create(receiver.url, ["charge.persisted"], description)
    try:
        yield hooks, receiver
    finally:
        hooks.delete(endpoint.endpoint_id)
        receiver.server.shutdown()


def _accounts(n: int, balance: int) -> list[int]:
    from hotledger.ledger.feature import ledger

    service = ledger()
    ids = [service.create_account(f"wh-{time.monotonic_ns()}-{i}", "SYNC", 0) for i in range(n)]
    for user_id in ids:
        service.recharge(user_id, balance)
    return ids


def _p(values: list[float], q: float) -> float | None:
    if len(values) < (100 if q >= 0.99 else 1):
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def events_per_s(events: int) -> dict:
    from hotledger.ledger.feature import ledger

    with _endpoint("bench") as (hooks, receiver):
        accounts = _accounts(50, 10**9)
        for i in range(events):
            ledger().deduct(accounts[i % len(accounts)], 1)
        started = time.monotonic()
        counts = hooks.send_due(batch=500, seconds=600)
        sent_s = time.monotonic() - started
        body = json.dumps({"type": "charge.persisted", "data": {"event_id": "bench"}}).encode()
        started = time.monotonic()
        for _ in range(events):
            request = urllib.request.Request(
                receiver.url, data=body, method="POST", headers={"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=5):
                pass
        bare_s = time.monotonic() - started
    return {
        "webhook_events_per_s": round(counts["delivered"] / sent_s, 1),
        "bare_posts_per_s": round(events / bare_s, 1),
        "webhook_events_delivered": counts["delivered"],
    }


def backlog_drain_per_s(events: int, accounts: int) -> dict:
    from hotledger.ledger.feature import ledger

    with _endpoint("bench-backlog") as (hooks, _receiver):
        owners = _accounts(accounts, 10**9)
        for i in range(events):  # no sender runs: each stays PENDING
            ledger().deduct(owners[i % len(owners)], 1)
        started = time.monotonic()
        counts = hooks.send_due(batch=200, seconds=900)
        drained_s = time.monotonic() - started
    return {
        "webhook_backlog_drain_per_s": round(counts["delivered"] / drained_s, 1),
        "webhook_backlog_delivered": counts["delivered"],
        "webhook_backlog_left": events - counts["delivered"],
    }


def delivery_lag(seconds: float) -> dict:
    from hotledger.ledger.feature import ledger

    answered: dict[str, float] = {}
    stop = threading.Event()
    with _endpoint("bench-lag") as (hooks, receiver):
        accounts = _accounts(20, 10**9)

        def send_until_stopped() -> None:  # as the function runs it: invocations back to back, looking again when idle
            while not stop.is_set():
                hooks.send_due(batch=200, seconds=1, idle_wait_s=0.05)

        sender = threading.Thread(target=send_until_stopped)
        sender.start()
        try:
            start = time.monotonic()
            for i in range(int(seconds * WEBHOOK_LAG_RATE)):
                time.sleep(max(0.0, start + i / WEBHOOK_LAG_RATE - time.monotonic()))  # paced: offered, not closed-loop
                result = ledger().deduct(accounts[i % len(accounts)], 1)
                answered[f"evt_{result.entry_id}"] = time.monotonic()
            deadline = time.monotonic() + 60
            while set(answered) - set(receiver.arrived) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop.set()
            sender.join()
    lags = [(receiver.arrived[e] - t) * 1000 for e, t in answered.items() if e in receiver.arrived]
    return {
        "webhook_delivery_lag_p50_ms": _p(lags, 0.5),
        "webhook_delivery_lag_p99_ms": _p(lags, 0.99),
        "webhook_delivery_lag_samples": len(lags),
        "webhook_not_delivered": len(answered) - len(lags),
        "webhook_lag_offered_per_s": WEBHOOK_LAG_RATE,
    }


def monitor_check(rows: int, rounds: int) -> dict:
    from hotledger.dal import db
    from hotledger.ledger.entry import Booked
    from hotledger.monitors import store as monitors
    from hotledger.monitors.feature import monitors as monitor_service

    watched, unwatched = _accounts(100, 10**6), _accounts(100, 10**6)
    for user_id in watched:
        monitor_service().create(user_id, "below", 500_000, None)
    now = int(time.time() * 1000)

    def booked(accounts: list[int]) -> list[Booked]:
        return [
            Booked(
                user_id=accounts[i % len(accounts)],
                seq=10**6 + i,
                entry_id=10**15 + i,
                type="deduct",
                amount=1,
                delta=-1,
                balance_after=10**6 - 1,
                available_after=10**6 - 1,
                booked_at=now,
                charged_at=now,
                ref=None,
            )
            for i in range(rows)
        ]

    def per_row_us(accounts: list[int]) -> float:
        times = []
        for _ in range(rounds):
            with db.transaction() as cur:
                started = time.perf_counter()
                monitors.judge(cur, booked(accounts))
                times.append((time.perf_counter() - started) / rows * 1e6)
                cur.connection.rollback()  # measured, not kept
        return round(statistics.median(times), 2)

    with_monitors, without = per_row_us(watched), per_row_us(unwatched)
    return {
        "monitor_check_us_per_booked_entry": with_monitors,
        "monitor_check_us_per_booked_entry_without_monitors": without,
    }


def _backlog(endpoint_id: int, first: int, last: int, now_ms: int, due: bool) -> None:
    """Deliveries `first` to `last` (not included) of the endpoint, PENDING, 100 per account (1 when due), written
    straight into the tables with their heads: due now, or every account's first one backing off an hour (none due)."""
    from hotledger.dal import db

    per_account = 1 if due else 100
    at = now_ms if due else now_ms + 3_600_000
    base = 1_500_000_000 + (endpoint_id % 50) * 10_000_000  # accounts of their own
    for start in range(first, last, 5000):
        rows, heads = [], []
        for i in range(start, min(last, start + 5000)):
            user_id, seq = base + i // per_account, i % per_account + 1
            rows.append((endpoint_id, user_id, seq, f"evt_b{endpoint_id}_{i}", at, now_ms))
            if seq == 1:
                heads.append((endpoint_id, user_id, at))
        with db.transaction() as cur:
            cur.executemany(
                "INSERT IGNORE INTO t_webhook_delivery (endpoint_id, user_id, seq, sub_seq, event_id, type, payload,"
                " state, next_attempt_at, created_at) VALUES (%s, %s, %s, 0, %s, 'charge.persisted', '{}', 'PENDING',"
                " %s, %s)",
                rows,
            )
            if heads:
                cur.executemany(
                    "INSERT IGNORE INTO t_webhook_head (endpoint_id, user_id, next_attempt_at) VALUES (%s, %s, %s)",
                    heads,
                )


def due_cost(small: int, large: int) -> dict:
    from hotledger.dal import db

    found: dict[str, float] = {}
    with _endpoint("bench-failing") as (hooks, _failing), _endpoint("bench-healthy") as (_, _healthy):
        failing, healthy = (e.endpoint_id for e in hooks.endpoints()[-2:])
        now = hooks.clock()
        _backlog(healthy, 0, 10, now, due=True)
        written = 0
        for name, size in (("webhook_due_ms_10k_backlog", small), ("webhook_due_ms_1m_backlog", large)):
            _backlog(failing, written, size, now, due=False)  # the larger backlog adds to the smaller one
            written = size
            times = []
            for _ in range(21):
                started = time.perf_counter()
                due = hooks.store.due(now, 200)
                times.append((time.perf_counter() - started) * 1000)
            assert {d.endpoint_id for d in due} >= {healthy} and failing not in {d.endpoint_id for d in due}
            found[name] = round(statistics.median(times), 2)
        for endpoint_id in (failing, healthy):
            db.execute("DELETE FROM t_webhook_head WHERE endpoint_id = %s", (endpoint_id,))
            while db.execute("DELETE FROM t_webhook_delivery WHERE endpoint_id = %s LIMIT 50000", (endpoint_id,)):
                pass
    found["webhook_due_backlog_ratio"] = round(
        found["webhook_due_ms_1m_backlog"] / found["webhook_due_ms_10k_backlog"], 2
    )
    return found


def figures(size) -> dict:
    """The figures at `size` (harness.Size)."""
    found = {
        **events_per_s(size.pick(2000, 300, 30)),
        **backlog_drain_per_s(size.pick(BACKLOG, BACKLOG, 100), BACKLOG_ACCOUNTS),
        **delivery_lag(size.pick(20, 5, 1)),
        **monitor_check(200, size.pick(20, 5, 1)),
        **due_cost(size.pick(10_000, 10_000, 200), size.pick(1_000_000, 100_000, 2_000)),
    }
    found["_samples"] = {
        "webhook_events_per_s": found["webhook_events_delivered"],
        "webhook_backlog_drain_per_s": found["webhook_backlog_delivered"],
        "webhook_delivery_lag_p99_ms": found["webhook_delivery_lag_samples"],
    }
    return found


if __name__ == "__main__":
    sys.path[:0] = [str(REPO / "functions"), str(REPO), str(REPO / "bench")]
    import harness

    with harness.environment("hotledger_bench_webhooks"):
        print(json.dumps(figures(harness.Size.of("--quick" in sys.argv)), indent=2))
