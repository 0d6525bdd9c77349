"""Quotas and cursors (issue 35, class 2), through the real entry points (the API handler, the reconciler function):
- a request that abandons its Idempotency-Key (nothing changed: a 503, a 429 that is not the key's answer) gives
  the key's count in its scope's quota back, so a caller at its quota is not locked out by refusals it never got
  an answer from;
- each reconciler part that pages keeps a cursor (dal/cursor.py) and the next run resumes after it: a run sees only
  what is past the cursor, never the items before it again (a part restarting from its first item every run would
  never reach the last ones of a large table within its budget)."""

from __future__ import annotations

import time
import uuid

import pytest

from helpers import invoke_writer, ledger_records, reconcile
from hotledger import keys
from hotledger.dal.idempotency import quota_key
from hotledger.runtime import idempotency, ledger_store, reconciler


def _key() -> dict:
    return {"Idempotency-Key": f"q-{uuid.uuid4().hex[:12]}"}


# quotas ----------------------------------------------------------------------------------------------------------
def test_a_route_key_abandoned_by_a_refusal_that_is_not_its_answer_gives_its_quota_back(api, redis_client, monkeypatch):
    """A red packet refused 429 TOO_MANY_PENDING (the ledger's backlog: not the key's answer) gives its key back and
    its count in the sender's quota: with a quota of one key, the next key still opens once the writer caught up."""
    sender = api.account(balance="100.00")  # one pending entry: the recharge (no writer runs here)
    monkeypatch.setattr(idempotency(), "max_keys", 1)
    monkeypatch.setattr(ledger_store(), "max_pending", 1, raising=False)
    quota = quota_key(f"account:{sender}")
    request = {"sender_id": sender, "total": "2.00", "count": 2}
    status, body = api("POST", "/redpackets", request, _key())
    assert (status, body["error"]["code"]) == (429, "TOO_MANY_PENDING"), body
    assert int(redis_client.get(quota) or 0) == 0  # the abandoned key no longer counts
    assert invoke_writer(ledger_records(redis_client, [sender]))["batchItemFailures"] == []
    status, body = api("POST", "/redpackets", request, _key())  # another key: the scope's one key of the window
    assert status == 201, body
    assert int(redis_client.get(quota)) == 1
    status, body = api("POST", "/redpackets", request, _key())  # and the quota still bounds it
    assert (status, body["error"]["code"]) == (429, "TOO_MANY_KEYS"), body
    assert int(redis_client.get(quota)) == 1


def test_a_route_key_abandoned_by_a_503_gives_its_quota_back(api, redis_client, monkeypatch):
    """The same for a 503 that changed nothing: the DB was unavailable when the payment order was to be written."""
    from hotledger.dal.db import DatabaseUnavailable
    from hotledger.runtime import payment_orders

    user = api.account(balance="10.00")
    monkeypatch.setattr(idempotency(), "max_keys", 1)
    quota = quota_key(f"account:{user}")
    request = {"user_id": user, "amount": "1.00", "close_in_s": 600}

    def db_down(*args, **kwargs):
        raise DatabaseUnavailable("the DB is down")

    with monkeypatch.context() as down:
        down.setattr(payment_orders(), "create", db_down)
        status, body = api("POST", "/orders", request, _key())
        assert status == 503, body
    assert int(redis_client.get(quota) or 0) == 0
    status, body = api("POST", "/orders", request, _key())
    assert status == 201, body
    assert int(redis_client.get(quota)) == 1


# cursors ---------------------------------------------------------------------------------------------------------
@pytest.fixture
def cursors():
    """The reconciler's cursors (the ones its function keeps in Redis); each part's put back after the test."""
    kept = reconciler().cursors
    saved = {part.name: kept.get(part.name) for part in reconciler().parts}
    yield kept
    for part, after in saved.items():
        kept.set(part, after)


def _run(monkeypatch) -> dict:
    """One scheduled run of the reconciler function (entries older than an hour count as stale)."""
    return reconcile(monkeypatch, 3600)


def test_the_accounts_part_resumes_after_its_cursor(api, redis_client, monkeypatch, cursors):
    """Two accounts whose cached balances drifted: with the accounts cursor at the first, a run corrects only the
    second; the next pass from the start corrects the first."""
    users = [api.account(balance="20.00") for _ in range(2)]
    invoke_writer(ledger_records(redis_client, users))  # nothing pending: the caches agree with the DB
    for user in users:
        redis_client.hincrby(keys.balance(user), "balance", 300)
    assert [api("GET", f"/accounts/{u}")[1]["balance"] for u in users] == ["23.00", "23.00"]
    cursors.set("accounts", users[0])
    _run(monkeypatch)
    assert [api("GET", f"/accounts/{u}")[1]["balance"] for u in users] == ["23.00", "20.00"]
    assert cursors.get("accounts") == 0  # it reached the last account: the next run starts from the first
    _run(monkeypatch)
    assert [api("GET", f"/accounts/{u}")[1]["balance"] for u in users] == ["20.00", "20.00"]


def test_the_vouchers_part_resumes_after_its_cursor(api, redis_client, monkeypatch, cursors):
    """Two vouchers whose Redis stock drifted from the DB's: with the vouchers cursor at the first, a run corrects
    only the second."""
    now = int(time.time() * 1000)
    vouchers = [
        api("POST", "/vouchers", {"title": "t", "stock": 10, "begin_at": now - 1000, "end_at": now + 3_600_000})[1][
            "voucher_id"
        ]
        for _ in range(2)
    ]

    def stocks():
        return [int(redis_client.hget(keys.voucher(int(v)), "stock")) for v in vouchers]

    for v in vouchers:
        redis_client.hincrby(keys.voucher(int(v)), "stock", 5)
    assert stocks() == [15, 15]
    cursors.set("vouchers", int(vouchers[0]))
    _run(monkeypatch)
    assert stocks() == [15, 10]
    assert cursors.get("vouchers") == 0
    _run(monkeypatch)
    assert stocks() == [10, 10]


def test_the_packets_part_resumes_after_its_cursor(api, monkeypatch, cursors):
    """Two red packets past their expiry: with the packets cursor at the first, a run expires and refunds only the
    second."""
    sender = api.account(balance="10.00")
    packets = [
        api("POST", "/redpackets", {"sender_id": sender, "total": "1.00", "count": 1, "expires_in_s": 1})[1][
            "packet_id"
        ]
        for _ in range(2)
    ]
    time.sleep(1.2)

    def states():
        return [api("GET", f"/redpackets/{p}")[1]["state"] for p in packets]

    assert states() == ["OPEN", "OPEN"]
    cursors.set("packets", int(packets[0]))
    _run(monkeypatch)
    first, second = states()
    assert first == "OPEN" and second != "OPEN", (first, second)
    assert cursors.get("packets") == 0
    _run(monkeypatch)
    assert "OPEN" not in states()


def test_the_reminders_part_resumes_after_its_cursor(api, monkeypatch, cursors):
    """Two open payment orders whose close reminders Redis lost: with the reminders cursor at the first, a run offers
    only the second's again."""
    from hotledger.notices.payment_orders import REMINDER_QUEUE
    from hotledger.runtime import delay_queue

    user = api.account(balance="10.00")
    orders = [
        api("POST", "/orders", {"user_id": user, "amount": "1.00", "close_in_s": 3600})[1]["order_id"] for _ in range(2)
    ]
    queue = delay_queue()
    for order in orders:
        assert queue.remove(REMINDER_QUEUE, str(order))  # Redis lost it
    assert queue.absent(REMINDER_QUEUE, [str(o) for o in orders]) == [str(o) for o in orders]
    cursors.set("reminders", int(orders[0]))
    _run(monkeypatch)
    assert queue.absent(REMINDER_QUEUE, [str(o) for o in orders]) == [str(orders[0])]
    assert cursors.get("reminders") == 0
    _run(monkeypatch)
    assert queue.absent(REMINDER_QUEUE, [str(o) for o in orders]) == []


def test_the_holds_part_resumes_after_its_cursor(api, redis_client, monkeypatch, cursors):
    """Two holds past their expiry that the DB still has ACTIVE: with the holds cursor at the first, a run ends only
    the second (an ACTIVE hold past expires_at reads EXPIRED through the API: what Redis holds ACTIVE, in its
    account's expiry index, is what the reconciler has not ended)."""
    from hotledger.holds import feature

    monkeypatch.setattr(feature, "EXPIRY_GRACE_MS", 0)
    user = api.account(balance="10.00")
    holds = [
        api("POST", f"/accounts/{user}/holds", {"amount": "1.00", "expires_in_s": 1})[1]["hold_id"] for _ in range(2)
    ]
    assert invoke_writer(ledger_records(redis_client, [user]))["batchItemFailures"] == []  # the DB has them ACTIVE
    time.sleep(1.2)

    def active():
        return [redis_client.zscore(keys.hold_expiry(user), str(h)) is not None for h in holds]

    assert active() == [True, True]
    cursors.set("holds", int(holds[0]))
    _run(monkeypatch)
    assert active() == [True, False]
    assert cursors.get("holds") == 0
    _run(monkeypatch)
    assert active() == [False, False]
