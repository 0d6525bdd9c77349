"""The Redis Streams transport (EVENT_TRANSPORT=redis-stream): the scripts XADD their events atomically,
the scheduled drainer (a consumer group) persists them, acknowledges after the commit, reclaims what a
killed consumer left pending, and dead-letters an entry that keeps failing on its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import Api
from hotledger import keys
from infra.localrt import events

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stream_mode(monkeypatch):
    """This process switched to the Redis Streams transport with two shards, a fresh consumer group."""
    from hotledger import runtime

    group = f"g-{time.monotonic_ns()}"
    for name, value in {
        "EVENT_TRANSPORT": "redis-stream",
        "STREAM_SHARDS": "2",
        "STREAM_GROUP": group,
        "STREAM_CLAIM_IDLE_MS": "300",
        "STREAM_BLOCK_MS": "100",
        "STREAM_MAX_DELIVERIES": "2",
    }.items():
        monkeypatch.setenv(name, value)
    runtime.reset()
    yield runtime
    monkeypatch.undo()
    runtime.reset()


def drain_once(runtime, seconds: float = 1.0):
    deadline = time.monotonic() + seconds
    return runtime.stream_consumer("test").drain(lambda: time.monotonic() < deadline)


def stream_length(redis_client) -> int:
    return sum(redis_client.xlen(keys.stream(shard)) for shard in range(2))


def test_charges_orders_and_grabs_travel_through_the_stream_and_persist_once(stream_mode, api, sql, redis_client):
    user_id = api.account(balance="50.00")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "5.00"})[0] == 200
    status, body = api("POST", "/vouchers", {"title": "s", "stock": 3, "begin_at": 0, "end_at": 2**41})
    voucher_id = int(body["voucher_id"])
    status, order = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": user_id})
    assert status == 200
    assert stream_length(redis_client) == 3  # recharge, deduct, order: XADDed by the scripts themselves
    assert api("GET", f"/vouchers/{voucher_id}/orders/{order['order_id']}")[1]["status"] == "PENDING"

    report = drain_once(stream_mode)
    assert report.applied == 3
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((4500,),)
    assert api("GET", f"/vouchers/{voucher_id}/orders/{order['order_id']}")[1]["status"] == "PERSISTED"
    assert api("GET", f"/accounts/{user_id}")[1]["pending_orders"] == 0
    assert stream_length(redis_client) == 0  # acknowledged and deleted after the commit
    assert redis_client.hget(keys.balance(user_id), "balance") == b"4500"
    assert keys.balance(user_id).startswith("user:balance:{s")  # shard-tagged: the stream shares the slot


def test_red_packet_on_the_stream_transport(stream_mode, api, sql):
    sender, grabber = api.account(balance="10.00"), api.account()
    status, body = api("POST", "/redpackets", {"sender_id": sender, "total": "4.00", "count": 2})
    packet_id = body["packet_id"]
    status, grab = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert status == 200 and grab["credit"] == "PENDING"
    drain_once(stream_mode)  # the claim, then the credit the drainer's commit made
    drain_once(stream_mode)
    assert sql(
        "SELECT user_id, amount FROM t_red_packet_item WHERE packet_id = %s AND user_id IS NOT NULL", (packet_id,)
    ) == ((grabber, int(grab["amount"].replace(".", ""))),)
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (grabber,)) == (
        (int(grab["amount"].replace(".", "")),),
    )


_READ_THEN_HANG = """
import os, sys, time
from hotledger.runtime import stream_consumer
consumer = stream_consumer("doomed")
writer = consumer.writer
def persist_then_hang(events, poison=()):
    if sys.argv[1] == "after_commit":
        writer.__class__.persist(writer, events, poison)
    open(sys.argv[2], "w").write(str(len(events)))
    time.sleep(3600)
consumer.writer = type("Hanging", (), {"persist": staticmethod(persist_then_hang)})()
consumer.drain(lambda: True)
"""


@pytest.mark.parametrize("kill_point", ["before_commit", "after_commit"])
def test_a_consumer_killed_before_its_ack_leaves_entries_that_are_reclaimed_and_persisted_once(
    stream_mode, api, sql, tmp_path, kill_point
):
    user_id = api.account(balance="20.00")
    for _ in range(4):
        assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
    marker = tmp_path / "read"
    child = subprocess.Popen(
        [sys.executable, "-c", _READ_THEN_HANG, kill_point, str(marker)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'functions'}:{REPO}"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the doomed consumer never read the entries"
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    expected_before = 0 if kill_point == "before_commit" else 4
    assert sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((expected_before,),)
    time.sleep(0.4)  # past STREAM_CLAIM_IDLE_MS
    report = drain_once(stream_mode)
    assert report.reclaimed == 5  # the recharge and four deducts
    assert sql("SELECT COUNT(*), SUM(amount) FROM t_order WHERE user_id = %s", (user_id,)) == ((4, 400),)
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1600,),)


def test_an_entry_that_keeps_failing_alone_goes_to_the_dead_letter_stream(
    stream_mode, api, sql, redis_client, monkeypatch
):
    from hotledger.runtime import writer

    user_id = api.account(balance="5.00")
    real_persist = writer().persist
    recharge_ids = set()

    def persist_fails_for_the_recharge(events, poison=()):
        if any(getattr(e, "kind", None) == "R" for e in events):
            recharge_ids.update(e.id for e in events if getattr(e, "kind", None) == "R")
            raise ValueError("a bug this event triggers")
        return real_persist(events, poison)

    monkeypatch.setattr(writer(), "persist", persist_fails_for_the_recharge)
    consumer = stream_mode.stream_consumer("test")
    for _ in range(6):  # read, then reclaimed and retried until delivered more than STREAM_MAX_DELIVERIES times
        deadline = time.monotonic() + 0.4
        consumer.drain(lambda deadline=deadline: time.monotonic() < deadline)
    shard = keys.shard_of(str(user_id))
    dead = redis_client.xrange(keys.dead_stream(shard))
    assert len(dead) == 1 and b"a bug this event triggers" in dead[0][1][b"error"]
    assert stream_length(redis_client) == 0
    assert recharge_ids

    # the bug fixed, an operator replays it (issue 21's console): back in its stream once, persisted once
    monkeypatch.setattr(writer(), "persist", real_persist)
    operator = Api(scopes=("admin",))
    status, listed = operator("GET", "/ops/dead-letters?source=stream")
    dead_id = f"{shard}:{dead[0][0].decode()}"
    assert status == 200 and dead_id in [d["id"] for d in listed["stream"]], listed
    for outcome in (
        {"replayed": [dead_id], "skipped": {}},
        {"replayed": [], "skipped": {dead_id: "not a dead entry (replayed already, or no such entry)"}},
    ):
        assert operator("POST", "/ops/dead-letters/replay", {"source": "stream", "ids": [dead_id]}) == (200, outcome)
    assert redis_client.xlen(keys.dead_stream(shard)) == 0 and stream_length(redis_client) == 1
    assert drain_once(stream_mode).applied == 1
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((500,),)


def test_drainer_function_with_a_scheduled_event(stream_mode, api, sql):
    from stream_drainer.app import handler

    user_id = api.account(balance="7.00")
    result = handler(events.scheduled(), events.LambdaContext("StreamDrainerFunction", timeout_s=5))
    assert result["applied"] >= 1
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((700,),)


def test_drainer_skips_on_the_kafka_transport():
    from stream_drainer.app import handler

    assert "skipped" in handler(events.scheduled(), events.LambdaContext("StreamDrainerFunction", timeout_s=5))


def test_a_holds_changes_travel_through_the_stream_and_are_booked_once(stream_mode, api, sql, redis_client):
    """hold_change XADDs its events itself (a description with JSON's special characters
    included); the consumer books them."""
    user_id = api.account(balance="30.00")
    status, hold = api("POST", f"/accounts/{user_id}/holds", {"amount": "10.00", "description": 'taxi "7"; \\ é'})
    assert status == 201, hold
    assert api("POST", f"/accounts/{user_id}/holds/{hold['hold_id']}/capture", {"amount": "4.00"})[0] == 200
    status, body = api("POST", f"/accounts/{user_id}/holds/{hold['hold_id']}/void")
    assert status == 200 and body["state"] == "VOIDED"  # no capture waits in the stream transport: durable at once
    assert drain_once(stream_mode).applied == 4
    assert sql("SELECT amount, captured, state, description FROM t_hold WHERE id = %s", (int(hold["hold_id"]),)) == (
        (1000, 400, "VOIDED", 'taxi "7"; \\ é'),
    )
    assert sql(
        "SELECT type, delta, balance_after, available_after FROM t_entry WHERE user_id = %s ORDER BY seq", (user_id,)
    ) == (
        ("recharge", 3000, 3000, 3000),
        ("hold", 0, 3000, 2000),
        ("capture", -400, 2600, 2000),
        ("void", 0, 2600, 2600),
    )
    assert api("GET", f"/accounts/{user_id}")[1]["available"] == "26.00"


def test_a_grants_spend_and_expiry_travel_through_the_stream_and_are_booked_once(stream_mode, api, sql):
    """ledger_apply XADDs a granted recharge and a deduct's spent grants, ledger_grant_expire its expiry entry: the
    consumer books all of them (issue 34)."""
    from hotledger.grants.feature import grants

    user_id = api.account(balance="10.00")
    grant = {"expires_at": int(time.time() * 1000) + 1_000, "category": "promo"}
    status, body = api("POST", f"/accounts/{user_id}/recharge", {"amount": "5.00", "grant": grant})
    assert status == 200, body
    grant_id = int(body["pay_id"])
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})[0] == 200
    assert drain_once(stream_mode).applied == 3  # booked first: an expiry waits for what was charged before it
    time.sleep(1.05)
    assert grants().expire(user_id, grant_id) is True
    assert drain_once(stream_mode).applied == 1
    assert sql("SELECT remaining, state FROM t_grant WHERE id = %s", (grant_id,)) == ((0, "EXPIRED"),)
    assert sql("SELECT grant_id, amount FROM t_grant_spend WHERE user_id = %s", (user_id,)) == ((grant_id, 200),)
    assert sql("SELECT type, delta FROM t_entry WHERE user_id = %s ORDER BY seq", (user_id,))[-1] == (
        "grant_expiry",
        -300,
    )
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1000,),)
