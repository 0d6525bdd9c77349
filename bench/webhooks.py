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
- `webhook_1m_backlog_drain_per_s` (issue 32): one sender, as the function runs it (`send_due` with its defaults),
  draining a backlog of 1,000,000 PENDING deliveries spread over 10 endpoints (100,000 each, 100 per account), each
  at a receiver of its own answering 204 at once, delivered events/s over a window (`DRAIN_WINDOW_S`; what is left
  stays); `webhook_1m_backlog_drain_ratio` against `bare_posts_per_s`, goal >= 0.5. The backlog is written straight
  into the tables in bulk by SQL (`_backlog`: the delivery rows and their accounts' heads, every one due), not booked
  one entry at a time (`--quick`: 100,000; the smoke pass: 2,000, drained to the end).
- `webhook_delivery_lag_p99_ms_beside_blackhole` (issue 32): the delivery lag of the healthy endpoint above
  (`WEBHOOK_LAG_RATE` SYNC deducts/s) while a blackholed endpoint beside it (it accepts connections and never answers:
  each attempt runs to its deadline) holds 300 due accounts, against `webhook_delivery_lag_p99_ms_alone`, the same lag
  without it; both with the sender as the function runs it (one `send_due` covering the window, looking again every
  50 ms when idle). Their ratio `webhook_blackhole_lag_ratio`, goal <= 1.2.
- `monitor_check_us_per_booked_entry`: what judging balance monitors adds to booking one entry (`monitors.store.judge`
  in the booking transaction, accounts with one monitor each), against `..._without_monitors` (the same rows,
  accounts with none). The deduct script itself does not change with monitors: they are judged where the entry is
  booked, so a crossing is a durable fact.

Called by bench/run.py; alone: PYTHONPATH=functions:. .venv/bin/python bench/webhooks.py [--quick]
"""

from __future__ import annotations

import contextlib
import json
import socket
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
DRAIN_ENDPOINTS = 10  # the 1M backlog's endpoints
DRAIN_WINDOW_S = 60  # how long the 1M backlog drains (at the baseline's rate, all of it would take half an hour)
BLACKHOLE_ACCOUNTS = 300  # due accounts of the blackholed endpoint


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


class _Blackhole:
    """A local endpoint that accepts connections and never answers: each attempt runs to its deadline."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hooks"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                self.held.append(self.listener.accept()[0])

    def close(self) -> None:
        for sock in [self.listener, *self.held]:
            sock.close()


@contextlib.contextmanager
def _endpoint(description: str, receiver: Any = None) -> Iterator[tuple[Any, Any, int]]:
    """The service's webhooks with an endpoint for charge.persisted at a local receiver (by default a _Receiver), and
    the endpoint's id; the endpoint deleted and the receiver stopped after."""
    from hotledger.webhooks.feature import webhooks

    hooks = webhooks()
    hooks.allow_local = True
    receiver = receiver or _Receiver()
    endpoint, _ = hooks.create(receiver.url, ["charge.persisted"], description)
    try:
        yield hooks, receiver, endpoint.endpoint_id
    finally:
        hooks.delete(endpoint.endpoint_id)
        _forget(endpoint.endpoint_id)
        receiver.close() if isinstance(receiver, _Blackhole) else receiver.server.shutdown()


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

    with _endpoint("bench") as (hooks, receiver, _):
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

    with _endpoint("bench-backlog") as (hooks, _receiver, _):
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


def _lags(hooks: Any, receiver: _Receiver, seconds: float, run_s: float) -> tuple[list[float], int]:
    """The lags (ms) from each paced SYNC deduct's answer to its event's arrival at `receiver`, with the sender running
    send_due for `run_s` at a time, back to back, looking again every 50 ms when idle; and how many never arrived."""
    from hotledger.ledger.feature import ledger

    answered: dict[str, float] = {}
    stop = threading.Event()
    accounts = _accounts(20, 10**9)

    def send_until_stopped() -> None:
        while not stop.is_set():
            hooks.send_due(batch=200, seconds=run_s, idle_wait_s=0.05)

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
    return lags, len(answered) - len(lags)


def delivery_lag(seconds: float) -> dict:
    with _endpoint("bench-lag") as (hooks, receiver, _):
        lags, lost = _lags(hooks, receiver, seconds, run_s=1)  # invocations of a second, back to back
    return {
        "webhook_delivery_lag_p50_ms": _p(lags, 0.5),
        "webhook_delivery_lag_p99_ms": _p(lags, 0.99),
        "webhook_delivery_lag_samples": len(lags),
        "webhook_not_delivered": lost,
        "webhook_lag_offered_per_s": WEBHOOK_LAG_RATE,
    }


def lag_beside_blackhole(seconds: float) -> dict:
    """The healthy endpoint's lag alone, then beside a blackholed endpoint holding BLACKHOLE_ACCOUNTS due accounts;
    the sender as the function runs it: one send_due covering the window (and the wait for the last arrivals)."""
    found: dict[str, Any] = {}
    for name in ("alone", "beside_blackhole"):
        with contextlib.ExitStack() as stack:
            if name == "beside_blackhole":
                hooks, _, hole = stack.enter_context(_endpoint("bench-blackhole", _Blackhole()))
                _backlog(hole, 0, BLACKHOLE_ACCOUNTS, hooks.clock(), due=True, per_account=1)
            hooks, receiver, _ = stack.enter_context(_endpoint(f"bench-lag-{name}"))
            lags, lost = _lags(hooks, receiver, seconds, run_s=seconds + 10)
        found[f"webhook_delivery_lag_p99_ms_{name}"] = _p(lags, 0.99)
        found[f"webhook_lag_samples_{name}"] = len(lags)
        found[f"webhook_not_delivered_{name}"] = lost
    alone, beside = found["webhook_delivery_lag_p99_ms_alone"], found["webhook_delivery_lag_p99_ms_beside_blackhole"]
    found["webhook_blackhole_lag_ratio"] = round(beside / alone, 2) if alone and beside else None
    return found


def drain_backlog(total: int, window_s: float) -> dict:
    """One send_due (the function's defaults) for window_s over `total` due deliveries spread over DRAIN_ENDPOINTS
    endpoints, written in bulk by SQL, 100 per account; delivered events/s."""
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(_endpoint(f"bench-drain-{i}")) for i in range(DRAIN_ENDPOINTS)]
        hooks = opened[0][0]
        now = hooks.clock()
        for _, _, endpoint_id in opened:
            _backlog(endpoint_id, 0, total // DRAIN_ENDPOINTS, now, due=True, per_account=100)
        started = time.monotonic()
        counts = hooks.send_due(seconds=window_s)
        drained_s = time.monotonic() - started
    return {
        "webhook_1m_backlog_drain_per_s": round(counts["delivered"] / drained_s, 1),
        "webhook_1m_backlog_size": total,
        "webhook_1m_backlog_delivered": counts["delivered"],
        "webhook_1m_backlog_window_s": round(drained_s, 1),
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


def _backlog(endpoint_id: int, first: int, last: int, now_ms: int, due: bool, per_account: int) -> None:
    """Deliveries `first` to `last` (not included) of the endpoint, PENDING, `per_account` per account, written
    straight into the tables in bulk with their heads: due now, or every account's first one backing off an hour (none
    due). Each body is the shape bare_posts_per_s posts."""
    from hotledger.dal import db

    at = now_ms if due else now_ms + 3_600_000
    base = 1_500_000_000 + (endpoint_id % 50) * 10_000_000  # accounts of their own
    for start in range(first, last, 5000):
        rows, heads = [], []
        for i in range(start, min(last, start + 5000)):
            user_id, seq = base + i // per_account, i % per_account + 1
            event_id = f"evt_b{endpoint_id}_{i}"
            body = json.dumps({"type": "charge.persisted", "data": {"event_id": event_id}})
            rows.append((endpoint_id, user_id, seq, event_id, body, at, now_ms))
            if seq == 1:
                heads.append((endpoint_id, user_id, at))
        with db.transaction() as cur:
            cur.executemany(
                "INSERT IGNORE INTO t_webhook_delivery (endpoint_id, user_id, seq, sub_seq, event_id, type, payload,"
                " state, next_attempt_at, created_at) VALUES (%s, %s, %s, 0, %s, 'charge.persisted', %s, 'PENDING',"
                " %s, %s)",
                rows,
            )
            if heads:
                cur.executemany(
                    "INSERT IGNORE INTO t_webhook_head (endpoint_id, user_id, next_attempt_at) VALUES (%s, %s, %s)",
                    heads,
                )


def _forget(endpoint_id: int) -> None:
    """The endpoint's deliveries and heads, gone (what the bench wrote; the reconciler's retention takes longer)."""
    from hotledger.dal import db

    db.execute("DELETE FROM t_webhook_head WHERE endpoint_id = %s", (endpoint_id,))
    while db.execute("DELETE FROM t_webhook_delivery WHERE endpoint_id = %s LIMIT 50000", (endpoint_id,)):
        pass


def due_cost(small: int, large: int) -> dict:
    found: dict[str, float] = {}
    with _endpoint("bench-failing") as (hooks, _, failing), _endpoint("bench-healthy") as (_, _, healthy):
        now = hooks.clock()
        _backlog(healthy, 0, 10, now, due=True, per_account=1)
        written = 0
        for name, size in (("webhook_due_ms_10k_backlog", small), ("webhook_due_ms_1m_backlog", large)):
            _backlog(failing, written, size, now, due=False, per_account=100)  # added to the smaller one
            written = size
            times = []
            for _ in range(21):
                started = time.perf_counter()
                due = hooks.store.due(now, 200)
                times.append((time.perf_counter() - started) * 1000)
            assert {d.endpoint_id for d in due} >= {healthy} and failing not in {d.endpoint_id for d in due}
            found[name] = round(statistics.median(times), 2)
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
        **drain_backlog(size.pick(1_000_000, 100_000, 2_000), size.pick(DRAIN_WINDOW_S, 20, 60)),
        **lag_beside_blackhole(size.pick(20, 5, 1)),
    }
    found["webhook_1m_backlog_drain_ratio"] = round(
        found["webhook_1m_backlog_drain_per_s"] / found["bare_posts_per_s"], 2
    )
    found["_samples"] = {
        "webhook_1m_backlog_drain_per_s": found["webhook_1m_backlog_delivered"],
        "webhook_delivery_lag_p99_ms_alone": found["webhook_lag_samples_alone"],
        "webhook_delivery_lag_p99_ms_beside_blackhole": found["webhook_lag_samples_beside_blackhole"],
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
