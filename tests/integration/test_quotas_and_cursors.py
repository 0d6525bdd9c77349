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
from hotledger.ledger.feature import ledger_store
from hotledger.runtime import idempotency, reconciler


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
    from hotledger.notices.feature import payment_orders

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


def test_a_route_keys_quota_is_per_window_and_the_next_window_opens_keys_again(api, redis_client, monkeypatch):
    """A scope opens at most MAX_IDEMPOTENCY_KEYS keys per window (the key records' lifetime, from its first key):
    the count expires with the window, so a caller at its quota opens keys again in the next one."""
    user = api.account(balance="10.00")
    monkeypatch.setattr(idempotency(), "max_keys", 1)
    monkeypatch.setattr(idempotency(), "ttl_s", 1)
    quota = quota_key(f"account:{user}")
    request = {"user_id": user, "amount": "1.00", "close_in_s": 600}
    assert api("POST", "/orders", request, _key())[0] == 201
    assert 0 < redis_client.pttl(quota) <= 1000  # the window
    status, body = api("POST", "/orders", request, _key())
    assert (status, body["error"]["code"]) == (429, "TOO_MANY_KEYS"), body
    time.sleep(1.1)
    assert api("POST", "/orders", request, _key())[0] == 201  # the next window


def test_an_accounts_deduct_key_quota_is_per_window_and_the_next_window_opens_keys_again(
    api, redis_client, monkeypatch
):
    """The same for the deduct and recharge keys an account opens (ledger_apply's count, ARGV[7] seconds)."""
    user = api.account(balance="10.00")
    monkeypatch.setattr(ledger_store(), "max_keys", 1, raising=False)
    monkeypatch.setattr(ledger_store(), "idempotency_ttl_s", 1)
    quota = keys.idempotency_quota(user)
    assert api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, _key())[0] == 200
    assert 0 < redis_client.pttl(quota) <= 1000
    status, body = api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, _key())
    assert (status, body["error"]["code"]) == (429, "TOO_MANY_KEYS"), body
    time.sleep(1.1)
    assert api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, _key())[0] == 200


# cursors ---------------------------------------------------------------------------------------------------------
# Each test makes two items A < B a part acts on, puts the part's cursor just before A and runs the reconciler
# function with a budget of one item a part: the first run acts on A alone and leaves its cursor at A, the second
# acts on B (not on A again, nor on the table's first item) and leaves it at B. Every run here is budgeted: a part
# whose cursor does not advance would otherwise go round its table for good.
@pytest.fixture
def cursors(monkeypatch):
    """The reconciler's cursors (the ones its function keeps in Redis), each part's put back after the test; every
    part's budget one item a run."""
    kept = reconciler().cursors
    saved = {part.name: kept.get(part.name) for part in reconciler().parts}
    monkeypatch.setattr(reconciler(), "part_items", 1)
    yield kept
    for part, after in saved.items():
        kept.set(part, after)


def _run(monkeypatch) -> dict:
    """One scheduled run of the reconciler function (entries older than an hour count as stale)."""
    return reconcile(monkeypatch, 3600)


def _step_by_step(monkeypatch, cursors, part: str, items: list[int], done) -> None:
    """done() -> [whether the part acted on A, on B]."""
    assert done() == [False, False]
    cursors.set(part, items[0] - 1)
    _run(monkeypatch)
    assert (done(), cursors.get(part)) == ([True, False], items[0])  # A alone: the run began past the cursor
    _run(monkeypatch)
    assert (done(), cursors.get(part)) == ([True, True], items[1])  # then B: resumed after A


def test_the_accounts_part_resumes_after_its_cursor(api, redis_client, monkeypatch, cursors):
    """Two accounts whose cached balances drifted: each run corrects the next one past the cursor."""
    users = [api.account(balance="20.00") for _ in range(2)]
    invoke_writer(ledger_records(redis_client, users))  # nothing pending: the caches agree with the DB
    for user in users:
        redis_client.hincrby(keys.balance(user), "balance", 300)

    def corrected():
        return [api("GET", f"/accounts/{u}")[1]["balance"] == "20.00" for u in users]

    _step_by_step(monkeypatch, cursors, "accounts", users, corrected)


def test_the_vouchers_part_resumes_after_its_cursor(api, redis_client, monkeypatch, cursors):
    """Two vouchers whose Redis stock drifted from the DB's: each run corrects the next one past the cursor."""
    now = int(time.time() * 1000)
    vouchers = [
        int(
            api("POST", "/vouchers", {"title": "t", "stock": 10, "begin_at": now - 1000, "end_at": now + 3_600_000})[1][
                "voucher_id"
            ]
        )
        for _ in range(2)
    ]
    for v in vouchers:
        redis_client.hincrby(keys.voucher(v), "stock", 5)

    def corrected():
        return [int(redis_client.hget(keys.voucher(v), "stock")) == 10 for v in vouchers]

    _step_by_step(monkeypatch, cursors, "vouchers", vouchers, corrected)


def test_the_packets_part_resumes_after_its_cursor(api, monkeypatch, cursors):
    """Two red packets past their expiry: each run expires and refunds the next one past the cursor."""
    sender = api.account(balance="10.00")
    packets = [
        int(
            api("POST", "/redpackets", {"sender_id": sender, "total": "1.00", "count": 1, "expires_in_s": 1})[1][
                "packet_id"
            ]
        )
        for _ in range(2)
    ]
    time.sleep(1.2)

    def ended():
        return [api("GET", f"/redpackets/{p}")[1]["state"] != "OPEN" for p in packets]

    _step_by_step(monkeypatch, cursors, "packets", packets, ended)


def test_the_reminders_part_resumes_after_its_cursor(api, monkeypatch, cursors):
    """Two open payment orders whose close reminders Redis lost: each run offers the next one's again."""
    from hotledger.notices.payment_orders import REMINDER_QUEUE
    from hotledger.runtime import delay_queue

    user = api.account(balance="10.00")
    orders = [
        int(api("POST", "/orders", {"user_id": user, "amount": "1.00", "close_in_s": 3600})[1]["order_id"])
        for _ in range(2)
    ]
    queue = delay_queue()
    for order in orders:
        assert queue.remove(REMINDER_QUEUE, str(order))  # Redis lost it

    def offered():
        return [queue.contains(REMINDER_QUEUE, str(o)) for o in orders]

    _step_by_step(monkeypatch, cursors, "reminders", orders, offered)


def test_the_holds_part_resumes_after_its_cursor(api, redis_client, monkeypatch, cursors):
    """Two holds past their expiry that the DB still has ACTIVE: each run ends the next one past the cursor (an ACTIVE
    hold past expires_at reads EXPIRED through the API: what Redis holds ACTIVE, in its account's expiry index, is
    what the reconciler has not ended)."""
    from hotledger.holds import feature

    monkeypatch.setattr(feature, "EXPIRY_GRACE_MS", 0)
    user = api.account(balance="10.00")
    holds = [
        int(api("POST", f"/accounts/{user}/holds", {"amount": "1.00", "expires_in_s": 1})[1]["hold_id"])
        for _ in range(2)
    ]
    assert invoke_writer(ledger_records(redis_client, [user]))["batchItemFailures"] == []  # the DB has them ACTIVE
    time.sleep(1.2)

    def ended():
        return [redis_client.zscore(keys.hold_expiry(user), str(h)) is None for h in holds]

    _step_by_step(monkeypatch, cursors, "holds", holds, ended)
