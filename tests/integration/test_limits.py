"""Memory is finite (Redis runs with noeviction): one caller cannot fill it. A delay queue and an account's pending
entries are bounded; past the bound a request is refused with a 429 and a code, changes nothing, and may be retried
once the queue drained or the writer caught up. Through the API handler (API Gateway events) on a real Redis."""

from __future__ import annotations

import uuid

import pytest

from helpers import invoke_writer, ledger_records
from hotledger import keys
from hotledger.ledger.entry import stored_key
from hotledger.ledger.feature import ledger_store
from hotledger.runtime import delay_queue, idempotency


def test_a_full_delay_queue_refuses_new_elements_and_still_moves_queued_ones(api, monkeypatch):
    queue = f"q-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(delay_queue(), "max_size", 3, raising=False)
    for n in range(3):
        assert api("POST", f"/delay-queues/{queue}/items", {"element": f"e{n}", "delay_s": 0})[0] == 200
    status, body = api("POST", f"/delay-queues/{queue}/items", {"element": "e3", "delay_s": 0})
    assert (status, body["error"]["code"]) == (429, "QUEUE_FULL"), body
    status, body = api("POST", f"/delay-queues/{queue}/items", {"element": "e0", "delay_s": 60})
    assert status == 200 and body["new"] is False  # moving a queued element's due time takes no room
    # taken and not acknowledged still holds memory: it counts
    taken = api("POST", f"/delay-queues/{queue}/take", {"limit": 2})[1]["elements"]
    assert len(taken) == 2
    assert api("GET", f"/delay-queues/{queue}")[1] | {"earliest_due_at": 0} == {
        "queue": queue,
        "size": 1,
        "taken": 2,
        "earliest_due_at": 0,
        "dead_letters": 0,
    }
    assert api("POST", f"/delay-queues/{queue}/items", {"element": "e3", "delay_s": 0})[0] == 429
    api("POST", f"/delay-queues/{queue}/ack", {"receipts": [taken[0]["receipt"]]})
    status, body = api("POST", f"/delay-queues/{queue}/items", {"element": "e3", "delay_s": 0})
    assert status == 200 and body["new"] is True
    assert api("GET", f"/delay-queues/{queue}")[1]["size"] + api("GET", f"/delay-queues/{queue}")[1]["taken"] == 3


def test_the_service_queues_are_not_bounded_by_the_client_limit(monkeypatch):
    """A payment order's close reminder is offered by the service itself: a client limit must not refuse it."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(delay_queue(), "max_size", 1, raising=False)
    assert delay_queue().offer(queue, "a", delay_ms=0) and delay_queue().offer(queue, "b", delay_ms=0)
    assert delay_queue().size(queue) == (2, 0)


def test_an_account_with_too_many_pending_entries_refuses_charges_until_the_writer_caught_up(
    api, redis_client, monkeypatch
):
    user = api.account(balance="100.00")  # one pending entry: the recharge (no writer runs here)
    monkeypatch.setattr(ledger_store(), "max_pending", 3, raising=False)
    for _n in range(2):
        assert api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"})[0] == 200
    assert redis_client.zcard(keys.pending(user)) == 3
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex[:8]}"}
    for route, headers in (("deduct", key), ("deduct", None), ("recharge", None)):
        status, body = api("POST", f"/accounts/{user}/{route}", {"amount": "1.00"}, headers)
        assert (status, body["error"]["code"]) == (429, "TOO_MANY_PENDING"), body
    account = api("GET", f"/accounts/{user}")[1]
    assert (account["balance"], account["version"], account["pending_orders"]) == ("98.00", 4, 3)  # nothing changed
    assert invoke_writer(ledger_records(redis_client, [user]))["batchItemFailures"] == []
    assert redis_client.zcard(keys.pending(user)) == 0
    # not the key's answer: the same request with the same key charges once the writer caught up
    status, body = api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, key)
    assert status == 200 and body["balance"] == "97.00", body


@pytest.mark.parametrize("route", ["redpacket", "pay"])
def test_a_ledger_backlog_refusal_is_never_a_keys_answer_on_any_route(api, redis_client, monkeypatch, route):
    """Issue 19 item 6: POST /redpackets and /orders/{id}/pay stored the ledger's 429 TOO_MANY_PENDING as the key's
    answer for good (docs/api.md: a 429 is never a key's answer). One rule for every route: the same request under the
    same key goes through once the writer caught up."""
    user = api.account(balance="100.00")  # one pending entry: the recharge (no writer runs here)
    monkeypatch.setattr(ledger_store(), "max_pending", 1, raising=False)
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex[:8]}"}
    if route == "redpacket":
        call = lambda: api("POST", "/redpackets", {"sender_id": user, "total": "2.00", "count": 2}, key)  # noqa: E731
    else:
        status, order = api("POST", "/orders", {"user_id": user, "amount": "3.00", "close_in_s": 3600})
        assert status == 201, order
        call = lambda: api("POST", f"/orders/{order['order_id']}/pay", None, key)  # noqa: E731
    status, body = call()
    assert (status, body["error"]["code"]) == (429, "TOO_MANY_PENDING"), body
    assert invoke_writer(ledger_records(redis_client, [user]))["batchItemFailures"] == []
    status, body = call()
    assert status in (200, 201) and "error" not in body, body
    assert api("GET", f"/accounts/{user}")[1]["balance"] in ("98.00", "97.00")


def test_a_caller_past_its_idempotency_key_quota_gets_too_many_keys_and_its_keys_still_answer(
    api, sql, monkeypatch, capfd
):
    from integration.test_observability import _lines, _metrics

    monkeypatch.setattr(idempotency(), "max_keys", 2)
    user = api.account(balance="10.00")
    request = {"user_id": user, "amount": "1.00", "close_in_s": 600}
    keyed = [{"Idempotency-Key": f"q-{uuid.uuid4().hex}"} for _ in range(3)]
    first = [api("POST", "/orders", request, headers) for headers in keyed[:2]]
    assert [status for status, _ in first] == [201, 201], first
    capfd.readouterr()
    status, body = api("POST", "/orders", request, keyed[2])
    assert (status, body["error"]["code"]) == (429, "TOO_MANY_KEYS"), body
    assert _metrics(_lines(capfd.readouterr().out))["Rejections"] == ([1.0], {"code": "TOO_MANY_KEYS"})
    assert sql("SELECT COUNT(*) FROM t_payment_order WHERE user_id = %s", (user,)) == ((2,),)  # nothing changed
    assert [api("POST", "/orders", request, headers) for headers in keyed[:2]] == first  # its keys still answer
    assert api("POST", "/orders", request)[0] == 201  # a request without a key opens no record
    other = api.account()
    assert api("POST", "/orders", {**request, "user_id": other}, keyed[2])[0] == 201  # the quota is per caller


def test_deduct_and_recharge_keys_past_the_quota_get_too_many_keys_and_their_keys_still_answer(
    api, redis_client, monkeypatch, capfd
):
    """Before: ledger_apply.lua made a new Idempotency-Key record for every deduct and recharge, uncounted, so one
    caller could fill Redis (noeviction) with them and make every charge fail."""
    from integration.test_observability import _lines, _metrics

    monkeypatch.setattr(ledger_store(), "max_keys", 2, raising=False)
    user = api.account(balance="10.00")
    keyed = [{"Idempotency-Key": f"q-{uuid.uuid4().hex}"} for _ in range(3)]
    first = [
        api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, keyed[0]),
        api("POST", f"/accounts/{user}/recharge", {"amount": "2.00"}, keyed[1]),
    ]
    assert [status for status, _ in first] == [200, 200], first
    before = api("GET", f"/accounts/{user}")[1]
    for route in ("deduct", "recharge"):
        capfd.readouterr()
        status, body = api("POST", f"/accounts/{user}/{route}", {"amount": "1.00"}, keyed[2])
        assert (status, body["error"]["code"]) == (429, "TOO_MANY_KEYS"), body
        assert _metrics(_lines(capfd.readouterr().out))["Rejections"] == ([1.0], {"code": "TOO_MANY_KEYS"})
    assert api("GET", f"/accounts/{user}")[1] == before  # nothing changed, nothing recorded for the key
    assert not redis_client.exists(keys.idempotency(user, stored_key(keyed[2]["Idempotency-Key"])))
    assert [
        api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, keyed[0]),  # its keys still answer
        api("POST", f"/accounts/{user}/recharge", {"amount": "2.00"}, keyed[1]),
    ] == first
    assert api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"})[0] == 200  # a charge without a key opens none
    other = api.account(balance="10.00")
    assert api("POST", f"/accounts/{other}/deduct", {"amount": "1.00"}, keyed[2])[0] == 200  # the quota is per account
    # the refusal was not the key's answer: with room again, the same request with the same key charges
    monkeypatch.setattr(ledger_store(), "max_keys", 3, raising=False)
    status, body = api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, keyed[2])
    assert status == 200 and body["balance"] == "9.00", body


def test_a_deduct_key_given_back_by_a_failed_publish_gives_its_count_back(api, monkeypatch):
    from hotledger.dal.publisher import NotAcknowledged
    from hotledger.ledger.feature import ledger

    def broker_down(key, value):
        raise NotAcknowledged("no acknowledgement in time")

    monkeypatch.setattr(ledger_store(), "max_keys", 1, raising=False)
    user = api.account(balance="10.00")
    key = {"Idempotency-Key": f"q-{uuid.uuid4().hex}"}
    with monkeypatch.context() as broker:
        broker.setattr(ledger().durability, "publish", broker_down)
        status, body = api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, key)
        assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED"), body
    status, body = api(
        "POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, {"Idempotency-Key": f"q-{uuid.uuid4().hex}"}
    )
    assert status == 200 and body["balance"] == "9.00", body


def test_max_idempotency_keys_set_in_the_environment_bounds_a_scopes_new_keys(api, monkeypatch):
    """Issue 19: MAX_IDEMPOTENCY_KEYS was read but no test changed it and saw the effect (it was missing from the SSM
    tunables too). Set as the template sets it, the service refuses a scope's next new key with 429 TOO_MANY_KEYS."""
    from hotledger import runtime

    monkeypatch.setenv("MAX_IDEMPOTENCY_KEYS", "2")
    runtime.reset()
    try:
        assert runtime.idempotency().max_keys == 2
        sender = api.account(balance="10.00")

        def send(key):
            return api(
                "POST", "/redpackets", {"sender_id": sender, "total": "1.00", "count": 1}, {"Idempotency-Key": key}
            )

        assert [send(k)[0] for k in ("k1", "k2")] == [201, 201]
        status, body = send("k3")
        assert (status, body["error"]["code"]) == (429, "TOO_MANY_KEYS"), body
        assert send("k1")[0] == 201  # its keys still answer
    finally:
        monkeypatch.delenv("MAX_IDEMPOTENCY_KEYS")
        runtime.reset()


# every setting reaches what it sets (issue 19): the variable, set as the template sets it, is what the component uses
WIRING = [
    ("IDEMPOTENCY_TTL_S", "7200", lambda rt: rt.idempotency().ttl_s),
    ("LOCK_WAIT_MS", "1234", lambda rt: rt.lock().wait_ms),
    ("LOCK_TTL_MS", "4321", lambda rt: rt.lock().lease_ms),
    ("DELAY_VISIBILITY_MS", "4500", lambda rt: rt.delay_queue().visibility_ms),
    ("DELAY_MAX_DELIVERIES", "7", lambda rt: rt.delay_queue().max_deliveries),
    ("DELAY_RETRY_BASE_MS", "250", lambda rt: rt.delay_queue().retry_base_ms),
    ("DELAY_RETRY_CAP_MS", "9000", lambda rt: rt.delay_queue().retry_cap_ms),
    ("DELAY_MAX_QUEUE_SIZE", "77", lambda rt: rt.delay_queue().max_size),
    ("INBOX_TTL_S", "600", lambda rt: rt.inbox().ttl_s),
    ("INBOX_MAX_MESSAGES", "9", lambda rt: rt.inbox().max_messages),
    ("RECONCILE_PAGE", "33", lambda rt: rt.ledger_reconcile().page),
    ("RECONCILE_PENDING_LIMIT", "44", lambda rt: rt.ledger_reconcile().pending_limit),
    ("RECONCILE_PART_ITEMS", "55", lambda rt: rt.reconciler().part_items),
    ("RECONCILE_PART_S", "6.5", lambda rt: rt.reconciler().part_s),
    ("RECONCILE_AGE_S", "66", lambda rt: rt.reconciler().age_s),
    (
        "KEY_RETENTION_DAYS",
        "3",
        lambda rt: next(p.run for p in rt.reconciler().parts if p.name == "keys").retention_ms // 86_400_000,
    ),
    ("EVENT_KEYS_MAX_AGE_S", "120", lambda rt: rt.event_keys().max_age_s),
    ("STREAM_BATCH", "12", lambda rt: rt.settings().stream_batch),  # the stream consumer reads it per call
    ("MAX_IDEMPOTENCY_KEYS", "88", lambda rt: rt.idempotency().max_keys),
]


@pytest.mark.parametrize("variable,value,used", WIRING, ids=[w[0] for w in WIRING])
def test_a_setting_reaches_the_component_it_sets(monkeypatch, variable, value, used):
    from hotledger import runtime

    monkeypatch.setenv(variable, value)
    runtime.reset()
    try:
        assert used(runtime) == (float(value) if "." in value else int(value))
    finally:
        monkeypatch.delenv(variable)
        runtime.reset()
