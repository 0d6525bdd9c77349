"""Issue 31, a new kind of entry by the table: an operator's balance adjustment (kinds A, up, and N, down, of
ledger/kinds.py; POST /ops/accounts/{id}/adjustments). Driven through the API handler, the writer function and the
reconciler function on the real Redis, DB and broker, on ASYNC and SYNC accounts."""

import time

import pytest

from helpers import Api, invoke_writer, ledger_records
from helpers.reconcile import reconcile_pass

ADJUST = "/ops/accounts/{}/adjustments"


def _adjust(api, user_id, amount, key, reason="goodwill credit, ticket 4711"):
    return api("POST", ADJUST.format(user_id), {"amount": amount, "reason": reason}, {"Idempotency-Key": key})


def _persist(redis_client, user_id):
    assert invoke_writer(ledger_records(redis_client, [user_id])) == {"batchItemFailures": []}


def _entries(api, user_id):
    status, body = api("GET", f"/accounts/{user_id}/entries?types=adjustment")
    assert status == 200, body
    return [(e["type"], e["balance_change"], e["balance_after"], e["state"]) for e in body["entries"]]


def _adjustment_rows(sql, user_id):
    return sql("SELECT amount, balance, mode FROM t_adjustment WHERE user_id = %s ORDER BY version", (user_id,))


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_an_operator_adjusts_a_balance_down_and_up_once_per_key(api, redis_client, sql, deduct_type):
    user_id = api.account(balance="10.00", deduct_type=deduct_type)
    status, down = _adjust(api, user_id, "-1.50", "adj-down")
    assert status == 200, down
    assert (down["amount"], down["balance"], down["mode"]) == ("-1.50", "8.50", deduct_type)
    assert _adjust(api, user_id, "-1.50", "adj-down") == (200, down)  # the key's first answer, no second change
    status, up = _adjust(api, user_id, "2.25", "adj-up")
    assert (status, up["balance"]) == (200, "10.75")
    status, conflict = _adjust(api, user_id, "2.00", "adj-up")
    assert (status, conflict["error"]["code"]) == (409, "IDEMPOTENCY_KEY_REUSED")
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "10.75"

    if deduct_type == "ASYNC":
        assert _entries(api, user_id) == [
            ("adjustment", "2.25", "10.75", "pending"),
            ("adjustment", "-1.50", "8.50", "pending"),
        ]
        _persist(redis_client, user_id)
        _persist(redis_client, user_id)  # a replayed batch books nothing twice
    assert _entries(api, user_id) == [
        ("adjustment", "2.25", "10.75", "booked"),
        ("adjustment", "-1.50", "8.50", "booked"),
    ]
    assert _adjustment_rows(sql, user_id) == ((150, 850, deduct_type), (225, 1075, deduct_type))
    assert sql(
        "SELECT type, delta, ref FROM t_entry WHERE user_id = %s AND type = 'adjustment' ORDER BY seq", (user_id,)
    ) == (("adjustment", -150, "key:adj-down"), ("adjustment", 225, "key:adj-up"))
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1075,),)
    # the operator and the reason are in the operators' log
    logged = [line for line in api("GET", "/ops/log")[1] if line["detail"].get("user_id") == user_id]
    assert {(line["action"], line["detail"]["amount"], line["detail"]["reason"]) for line in logged} == {
        ("adjustment", "-1.50", "goodwill credit, ticket 4711"),
        ("adjustment", "2.25", "goodwill credit, ticket 4711"),
    }


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_an_adjustment_below_the_threshold_is_refused_like_a_deduct_and_changes_nothing(api, sql, deduct_type):
    user_id = api.account(balance="5.00", deduct_type=deduct_type, threshold="1.00")
    status, body = _adjust(api, user_id, "-4.01", "adj-too-much")
    assert (status, body["error"]["code"]) == (402, "INSUFFICIENT_BALANCE")
    assert _adjust(api, user_id, "-4.01", "adj-too-much")[0] == 402  # the refusal is the key's answer
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "5.00"
    assert _adjust(api, user_id, "-4.00", "adj-to-threshold")[1]["balance"] == "1.00"
    assert _adjustment_rows(sql, user_id) == (((400, 100, "SYNC"),) if deduct_type == "SYNC" else ())


def test_only_an_operator_adjusts_and_a_bad_request_changes_nothing(api):
    user_id = api.account(balance="5.00")
    for caller in (Api(scopes=("service",)), Api(user_id=user_id, scopes=())):
        status, body = caller("POST", ADJUST.format(user_id), {"amount": "1.00", "reason": "x"})
        assert (status, body["error"]["code"]) == (403, "FORBIDDEN")
    for bad in (
        {"amount": "0.00", "reason": "x"},
        {"amount": "-1.234", "reason": "x"},
        {"amount": "1.00"},
        {"amount": 1, "reason": "x"},
    ):
        status, body = api("POST", ADJUST.format(user_id), bad)
        assert status == 422, (bad, body)
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "5.00"


def test_the_reconciler_persists_an_adjustment_whose_event_was_lost(api, sql, monkeypatch):
    user_id = api.account(balance="5.00")
    assert _adjust(api, user_id, "-2.00", "adj-lost")[0] == 200  # published, never given to the writer here
    reconcile_pass(monkeypatch, age_s=0)
    assert _adjustment_rows(sql, user_id) == ((200, 300, "ASYNC"),)
    assert _entries(api, user_id) == [("adjustment", "-2.00", "3.00", "booked")]


def test_a_failed_publish_takes_an_adjustment_back_both_ways(api, redis_client, sql, monkeypatch):
    from hotledger.dal.publisher import NotAcknowledged
    from hotledger.ledger.feature import ledger

    user_id = api.account(balance="5.00")

    def broker_down(key, value):
        raise NotAcknowledged("no acknowledgement in time")

    monkeypatch.setattr(ledger().durability, "publish", broker_down)
    for amount in ("-2.00", "3.00"):
        status, body = _adjust(api, user_id, amount, f"adj-{amount}")
        assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED")
    monkeypatch.undo()
    account = api("GET", f"/accounts/{user_id}")[1]
    assert (account["balance"], account["held_credits"], account["pending_orders"]) == ("5.00", "0.00", 1)
    assert _adjust(api, user_id, "-2.00", "adj--2.00")[1]["balance"] == "3.00"  # the key was no answer: it charges
    _persist(redis_client, user_id)
    assert _adjustment_rows(sql, user_id) == ((200, 300, "ASYNC"),)


def test_an_adjustment_down_spends_the_live_grants_first_as_a_deduct_does(api, redis_client, sql):
    user_id = api.account(balance="5.00")
    expires_at = int(time.time() * 1000) + 600_000
    status, grant = api(
        "POST",
        f"/accounts/{user_id}/recharge",
        {"amount": "2.00", "grant": {"expires_at": expires_at, "category": "promo"}},
    )
    assert status == 200, grant
    assert _adjust(api, user_id, "-1.50", "adj-grant")[1]["balance"] == "5.50"
    assert api("GET", f"/accounts/{user_id}")[1]["grants"][0]["remaining"] == "0.50"
    _persist(redis_client, user_id)
    status, body = api("GET", f"/accounts/{user_id}/entries?types=adjustment")
    assert [e["grants_spent"] for e in body["entries"]] == [[{"grant_id": grant["pay_id"], "amount": "1.50"}]]


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_an_adjustment_is_one_line_in_the_operators_log_and_its_key_is_bound_to_its_reason(api, deduct_type):
    user_id = api.account(balance="5.00", deduct_type=deduct_type)
    first = _adjust(api, user_id, "-1.00", "adj-once", reason="chargeback 17")
    assert first[0] == 200, first
    assert _adjust(api, user_id, "-1.00", "adj-once", reason="chargeback 17") == first  # a retry: the same answer
    status, body = _adjust(api, user_id, "-1.00", "adj-once", reason="chargeback 18")
    assert (status, body["error"]["code"]) == (409, "IDEMPOTENCY_KEY_REUSED")  # another reason is another request
    logged = [line for line in api("GET", "/ops/log")[1] if line["detail"].get("user_id") == user_id]
    assert [(line["action"], line["detail"]["reason"]) for line in logged] == [("adjustment", "chargeback 17")]


def test_an_adjustment_whose_log_line_was_lost_is_logged_by_its_retry(api, monkeypatch):
    from hotledger.ops.feature import operations

    user_id = api.account(balance="5.00")
    lost = operations().ops_log.write_once

    def crash(*args, **kwargs):  # the function dies after the charge, before its log line
        raise ConnectionError("killed")

    monkeypatch.setattr(operations().ops_log, "write_once", crash)
    with pytest.raises(ConnectionError):
        _adjust(api, user_id, "2.00", "adj-crash", reason="bonus")
    monkeypatch.setattr(operations().ops_log, "write_once", lost)
    assert _adjust(api, user_id, "2.00", "adj-crash", reason="bonus")[1]["balance"] == "7.00"
    logged = [line for line in api("GET", "/ops/log")[1] if line["detail"].get("user_id") == user_id]
    assert [(line["action"], line["detail"]["amount"]) for line in logged] == [("adjustment", "2.00")]
