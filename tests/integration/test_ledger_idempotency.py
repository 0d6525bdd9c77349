"""Idempotency-Keys of deducts and recharges (issue 10, items 1, 2 and 10), through the API handler with real Redis,
DB and broker, the writer handler fed the events the API published.

- the first definitive answer for a key (a charge or a business refusal) is its answer for life;
- a key outlives Redis: the DB (t_idempotency) backs every answer, consulted when Redis has no record;
- an operator's close or reopen is never undone by an event charged before it.
"""

import json

import pytest

from helpers import broker_records, invoke_writer, ledger_records, lift_rebuild_hold, signed_value
from hotledger import keys, runtime
from hotledger.dal.publisher import NotAcknowledged
from hotledger.ledger.rows import MAX_BALANCE


def forget_account(redis_client, user_id: int) -> None:
    """Redis loses everything it held of this account (cache, entries, idempotency records), as after a
    restart empty or a failover; the lock's fencing counter is another item's and is kept."""
    lost = list(redis_client.scan_iter(match=f"user:*{keys.tag(str(user_id))}*", count=1000))
    assert lost
    redis_client.delete(*lost)


def rebuilt_after_the_writer_caught_up(redis_client, user_id: int) -> None:
    """The account Redis lost is rebuilt, and its hold over new keys lifted, as it is once REBUILD_HOLD_S is over
    and the writer applied the log as it was at the loss (the tests' writer is fed by hand: no watermark to read)."""
    runtime.ledger().load_cache(user_id)
    lift_rebuild_hold(redis_client, keys.balance(user_id))


def reload_from_the_db(redis_client, user_id: int) -> None:
    """The test changed the account in the DB: the cache takes it from there (no loss, so no rebuild hold)."""
    redis_client.delete(keys.balance(user_id))
    runtime.ledger().load_cache(user_id, after_loss=False)


def persist(redis_client, user_id: int) -> None:
    """The writer persists every event the API published for this account."""
    assert invoke_writer(ledger_records(redis_client, [user_id])) == {"batchItemFailures": []}


def db_balance(sql, user_id: int) -> int:
    return sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,))[0][0]


def charges(sql, user_id: int) -> int:
    return sql(
        "SELECT (SELECT COUNT(*) FROM t_order WHERE user_id = %s) + (SELECT COUNT(*) FROM t_pay WHERE user_id = %s)",
        (user_id, user_id),
    )[0][0]


# 1. a refusal is an answer ------------------------------------------------------------------------------------
@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_an_insufficient_balance_refusal_is_the_keys_answer_after_a_recharge(api, redis_client, deduct_type):
    user_id = api.account(balance="5.00", deduct_type=deduct_type)
    headers = {"Idempotency-Key": "pay-402"}
    first = api("POST", f"/accounts/{user_id}/deduct", {"amount": "8.00"}, headers)
    assert first[0] == 402 and first[1]["error"]["code"] == "INSUFFICIENT_BALANCE"
    assert api("POST", f"/accounts/{user_id}/recharge", {"amount": "10.00"})[0] == 200
    assert (
        api("POST", f"/accounts/{user_id}/deduct", {"amount": "8.00"}, headers) == first
    )  # same status, code, message
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "15.00"
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "9.00"}, headers)
    assert status == 409 and body["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    if deduct_type == "ASYNC":  # and once Redis forgot the account, the DB still answers the refusal
        persist(redis_client, user_id)
        forget_account(redis_client, user_id)
        assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "8.00"}, headers) == first
        assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "15.00"


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_an_api_closed_refusal_is_the_keys_answer_after_an_operator_reopens(api, deduct_type):
    user_id = api.account(balance="5.00", deduct_type=deduct_type)
    assert api("PATCH", f"/accounts/{user_id}", {"api_open": False})[0] == 200
    headers = {"Idempotency-Key": "pay-403"}
    first = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"}, headers)
    assert first[0] == 403 and first[1]["error"]["code"] == "API_CLOSED"
    assert api("PATCH", f"/accounts/{user_id}", {"api_open": True})[0] == 200
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"}, headers) == first
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200  # the account itself is open
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "4.00"


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_a_balance_limit_refusal_is_the_keys_answer_after_a_deduct(api, sql, redis_client, deduct_type):
    user_id = api.account(deduct_type=deduct_type)
    sql("UPDATE t_account SET balance = %s WHERE user_id = %s", (MAX_BALANCE - 100, user_id))
    sql("UPDATE t_user SET api_open = 1, close_reason = NULL WHERE id = %s", (user_id,))
    reload_from_the_db(redis_client, user_id)
    headers = {"Idempotency-Key": "top-up-422"}
    first = api("POST", f"/accounts/{user_id}/recharge", {"amount": "2.00"}, headers)
    assert first[0] == 422 and first[1]["error"]["code"] == "BALANCE_LIMIT"
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "5.00"})[0] == 200
    assert api("POST", f"/accounts/{user_id}/recharge", {"amount": "2.00"}, headers) == first
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "89999999999994.00"  # 89999999999999.00 - 5.00


def test_a_payment_order_refused_for_its_balance_is_paid_after_a_top_up(api):
    """The service's own keys (payorder<id>, red packets') are not answered by a refusal: their callers keep the
    outcome in their own state and charge again under the same key."""
    user_id = api.account(balance="1.00")
    status, order = api("POST", "/orders", {"user_id": user_id, "amount": "5.00", "close_in_s": 3600})
    assert status == 201, order
    status, body = api("POST", f"/orders/{order['order_id']}/pay")
    assert status == 402 and body["error"]["code"] == "INSUFFICIENT_BALANCE"
    assert api("POST", f"/accounts/{user_id}/recharge", {"amount": "10.00"})[0] == 200
    status, body = api("POST", f"/orders/{order['order_id']}/pay")
    assert status == 200 and body["state"] == "PAID"
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "6.00"


def test_a_publish_failure_is_not_the_keys_answer(api, monkeypatch):
    """PUBLISH_FAILED changed nothing: the same key may try again, and then charges once."""
    from hotledger.runtime import ledger

    user_id = api.account(balance="10.00")
    headers = {"Idempotency-Key": "retry-after-503"}

    def broker_down(key, value):
        raise NotAcknowledged("no acknowledgement in time")

    monkeypatch.setattr(ledger().durability, "publish", broker_down)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"}, headers)
    assert status == 503 and body["error"]["code"] == "PUBLISH_FAILED"
    monkeypatch.undo()
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"}, headers)
    assert status == 200 and body["balance"] == "7.00"
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"}, headers) == (200, body)


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_a_recharge_reusing_a_deducts_key_is_a_conflict(api, sql, deduct_type):
    user_id = api.account(balance="10.00", deduct_type=deduct_type)
    headers = {"Idempotency-Key": "one-key"}
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"}, headers)[0] == 200
    status, body = api("POST", f"/accounts/{user_id}/recharge", {"amount": "3.00"}, headers)
    assert status == 409 and body["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "7.00"


# 2. keys outlive Redis -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["deduct", "recharge"])
def test_a_retry_after_redis_lost_the_account_answers_the_first_charge(api, redis_client, sql, route):
    user_id = api.account(balance="10.00")
    headers = {"Idempotency-Key": f"lost-{route}"}
    first = api("POST", f"/accounts/{user_id}/{route}", {"amount": "4.00"}, headers)
    assert first[0] == 200
    persist(redis_client, user_id)
    forget_account(redis_client, user_id)
    assert api("POST", f"/accounts/{user_id}/{route}", {"amount": "4.00"}, headers) == first
    status, body = api("POST", f"/accounts/{user_id}/{route}", {"amount": "5.00"}, headers)
    assert status == 409 and body["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    expected = 600 if route == "deduct" else 1400
    assert db_balance(sql, user_id) == expected and charges(sql, user_id) == 2
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == f"{expected // 100}.00"


@pytest.mark.parametrize("route", ["deduct", "recharge"])
def test_a_retry_after_redis_lost_a_charge_still_on_its_way_to_the_db_answers_the_first_charge(
    api, redis_client, sql, own_topic, route
):
    """Redis loses the account while the charge it acknowledged is still on its way to the DB (the writer lags). A
    retry under the charge's key must not be charged again under a new id: CI's chaos run got two 200s with two
    entry ids for one key. The rebuilt account answers a key that neither Redis nor the DB knows RECOVERING until
    the writer applied the log as it was at the rebuild; from then on the DB answers the key's first charge."""
    user_id = api.account(balance="10.00")
    headers = {"Idempotency-Key": f"in-flight-{route}"}
    first = api("POST", f"/accounts/{user_id}/{route}", {"amount": "4.00"}, headers)
    assert first[0] == 200
    forget_account(redis_client, user_id)
    for _ in range(2):  # REBUILD_HOLD_S over after the first retry; the writer still lags
        status, body = api("POST", f"/accounts/{user_id}/{route}", {"amount": "4.00"}, headers)
        assert (status, body["error"]["code"]) == (503, "RECOVERING"), body
        lift_rebuild_hold(redis_client, keys.balance(user_id), log_too=False)
    unkeyed = api("POST", f"/accounts/{user_id}/recharge", {"amount": "1.00"})
    assert unkeyed[0] == 200, unkeyed  # no key, no answer to contradict: charged at once
    invoke_writer(broker_records())  # the writer catches up
    lift_rebuild_hold(redis_client, keys.balance(user_id), log_too=False)
    assert api("POST", f"/accounts/{user_id}/{route}", {"amount": "4.00"}, headers) == first
    invoke_writer(broker_records())
    assert charges(sql, user_id) == 3  # the opening recharge, the keyed charge once, the unkeyed recharge
    expected = 700 if route == "deduct" else 1500
    assert db_balance(sql, user_id) == expected
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE record_key = %s", (str(user_id),)) == ((0,),)


def test_a_key_charged_on_async_is_remembered_on_sync_and_back(api, redis_client, sql):
    user_id = api.account(balance="20.00")
    first_async = api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"}, {"Idempotency-Key": "k-async"})
    assert first_async[0] == 200
    persist(redis_client, user_id)
    assert api("PATCH", f"/accounts/{user_id}", {"deduct_type": "SYNC"})[0] == 200
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"}, {"Idempotency-Key": "k-async"}) == first_async
    first_sync = api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"}, {"Idempotency-Key": "k-sync"})
    assert first_sync[0] == 200 and first_sync[1]["mode"] == "SYNC"
    assert api("PATCH", f"/accounts/{user_id}", {"deduct_type": "ASYNC"})[0] == 200
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"}, {"Idempotency-Key": "k-sync"}) == first_sync
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"}, {"Idempotency-Key": "k-async"}) == first_async
    assert db_balance(sql, user_id) == 1500 and charges(sql, user_id) == 3
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "15.00"


def test_the_writer_never_persists_a_second_entry_for_a_key(api, redis_client, sql):
    """Two entries with one key (charged in a window where Redis had forgotten the first one): the DB keeps the
    first and dead-letters the other, in one batch or across batches; never a double charge."""
    user_id = api.account(balance="10.00")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"}, {"Idempotency-Key": "twice"})[0] == 200
    records = ledger_records(redis_client, [user_id])
    original = json.loads(records[-1][3])
    second = {
        **original,
        "id": original["id"] + 1,
        "version": original["version"] + 1,
        "balance_after": original["balance_after"] - 100,
    }
    third = {**second, "id": original["id"] + 2, "version": original["version"] + 2}
    invoke_writer(records + [(0, 50, b"k", signed_value(second))])
    invoke_writer([(0, 51, b"k", signed_value(third))])
    assert sql("SELECT id FROM t_order WHERE user_id = %s", (user_id,)) == ((original["id"],),)
    assert db_balance(sql, user_id) == 900
    assert sql(
        "SELECT offset_no, error FROM t_dead_letter WHERE offset_no IN (%s, %s) ORDER BY offset_no",
        (second["id"], third["id"]),
    ) == (
        (second["id"], "Idempotency-Key already answered by another entry"),
        (third["id"], "Idempotency-Key already answered by another entry"),
    )


# 10. an operator's close stays closed -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "patch,charge,expected",
    [
        ({"api_open": False}, "deduct", (0, "ADMIN")),  # an event charged while open must not reopen the account
        ({"api_open": True}, "recharge", (1, None)),  # an event charged while closed must not close it again
    ],
)
def test_an_operators_change_is_not_undone_by_an_event_charged_before_it(
    api, redis_client, sql, patch, charge, expected
):
    user_id = api.account(balance="10.00")
    if patch["api_open"]:
        assert api("PATCH", f"/accounts/{user_id}", {"api_open": False})[0] == 200
    assert api("POST", f"/accounts/{user_id}/{charge}", {"amount": "1.00"})[0] == 200
    in_flight = ledger_records(redis_client, [user_id])  # published, not yet written
    assert api("PATCH", f"/accounts/{user_id}", patch)[0] == 200
    assert invoke_writer(in_flight) == {"batchItemFailures": []}
    assert sql("SELECT api_open, close_reason FROM t_user WHERE id = %s", (user_id,)) == (expected,)
    redis_client.delete(keys.balance(user_id))  # the next cache load reads the DB
    assert api("GET", f"/accounts/{user_id}")[1]["api_open"] is patch["api_open"]
    status, _ = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert status == (200 if patch["api_open"] else 403)


# keys are compared byte for byte (issue 19, item 2) ---------------------------------------------------------------
@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_keys_that_differ_only_in_case_are_different_keys_once_the_db_answers_them(api, redis_client, sql, deduct_type):
    """The DB answers a key Redis no longer holds; a case-folding collation made `order-a` answer `Order-A`'s charge
    (charging nothing) and `ORDER-A` with another amount a 409 for a key never used."""
    user_id = api.account(balance="10.00", deduct_type=deduct_type)
    path = f"/accounts/{user_id}/deduct"
    first = api("POST", path, {"amount": "1.00"}, {"Idempotency-Key": "Order-A"})
    assert first[0] == 200, first
    if deduct_type == "ASYNC":
        persist(redis_client, user_id)
    forget_account(redis_client, user_id)
    if deduct_type == "ASYNC":
        rebuilt_after_the_writer_caught_up(redis_client, user_id)
    lower = api("POST", path, {"amount": "1.00"}, {"Idempotency-Key": "order-a"})
    assert lower[0] == 200 and lower[1]["order_id"] != first[1]["order_id"], (first, lower)
    upper = api("POST", path, {"amount": "2.00"}, {"Idempotency-Key": "ORDER-A"})
    assert upper[0] == 200 and upper[1]["order_id"] not in (first[1]["order_id"], lower[1]["order_id"]), upper
    assert api("POST", path, {"amount": "1.00"}, {"Idempotency-Key": "Order-A"}) == first
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "6.00"
