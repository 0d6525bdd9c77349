"""The API function driven with API Gateway REST proxy events (no HTTP), against real Redis, DB and broker."""

import json
import os
import signal
import uuid

import pytest

from helpers import EVENTS, reconcile_pass
from infra.localrt import events


def test_create_get_recharge_deduct(api):
    user_id = api.account(threshold="1.00")
    status, body = api("GET", f"/accounts/{user_id}")
    assert status == 200
    assert body["balance"] == "0.00" and body["api_open"] is False and body["threshold"] == "1.00"
    status, body = api("POST", f"/accounts/{user_id}/recharge", {"amount": "100.00"})
    assert status == 200 and body["balance"] == "100.00" and body["pay_id"].isdigit()
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "12.34"})
    assert status == 200, body
    assert body == {
        "order_id": body["order_id"],
        "user_id": user_id,
        "amount": "12.34",
        "balance": "87.66",
        "version": body["version"],
        "mode": "ASYNC",
    }
    status, order = api("GET", f"/accounts/{user_id}/orders/{body['order_id']}")
    assert status == 200 and order["status"] == "PENDING" and order["balance_after"] == "87.66"
    status, account = api("GET", f"/accounts/{user_id}")
    assert account["balance"] == "87.66" and account["pending_orders"] == 2 and account["api_open"] is True


def test_duplicate_user_name_is_409(api):
    api.account(name="dup-name")
    status, body = api("POST", "/accounts", {"user_name": "dup-name"})
    assert status == 409 and body["error"]["code"] == "DUPLICATE_USER_NAME"


def test_insufficient_balance_and_threshold(api):
    user_id = api.account(balance="10.00", threshold="2.00")
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "8.01"})
    assert status == 402 and body["error"]["code"] == "INSUFFICIENT_BALANCE"
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "8.00"})[0] == 200


def test_exhausted_balance_closes_the_api_and_a_recharge_reopens_it(api):
    user_id = api.account(balance="5.00")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "5.00"})[0] == 200
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"})
    assert status == 403 and body["error"]["code"] == "API_CLOSED"
    assert api("POST", f"/accounts/{user_id}/recharge", {"amount": "1.00"})[0] == 200
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"})[0] == 200


def test_operator_close_survives_a_recharge(api):
    user_id = api.account(balance="5.00")
    status, body = api("PATCH", f"/accounts/{user_id}", {"api_open": False})
    assert status == 200 and body["api_open"] is False
    status, body = api("POST", f"/accounts/{user_id}/recharge", {"amount": "1.00"})
    assert status == 200 and body["balance"] == "6.00", body
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"})[1]["error"]["code"] == "API_CLOSED"
    api("PATCH", f"/accounts/{user_id}", {"api_open": True})
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"})[0] == 200


@pytest.mark.parametrize("route", ["deduct", "recharge"])
def test_idempotency_key_replays_and_conflicts(api, route):
    user_id = api.account(balance="50.00")
    headers = {"Idempotency-Key": f"key-{route}"}
    first = api("POST", f"/accounts/{user_id}/{route}", {"amount": "10.00"}, headers)
    again = api("POST", f"/accounts/{user_id}/{route}", {"amount": "10.00"}, headers)
    assert first[0] == again[0] == 200 and first[1] == again[1]
    status, body = api("POST", f"/accounts/{user_id}/{route}", {"amount": "11.00"}, headers)
    assert status == 409 and body["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    expected = "40.00" if route == "deduct" else "60.00"
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == expected


def test_sync_account_charges_in_the_db(api, sql):
    user_id = api.account(deduct_type="SYNC", balance="20.00")
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "5.00"}, {"Idempotency-Key": "s1"})
    assert status == 200 and body["mode"] == "SYNC" and body["balance"] == "15.00"
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "5.00"}, {"Idempotency-Key": "s1"})[1] == body
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "6.00"}, {"Idempotency-Key": "s1"})[0] == 409
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1500,),)
    assert sql("SELECT amount, mode FROM t_order WHERE user_id = %s", (user_id,)) == ((500, "SYNC"),)
    status, order = api("GET", f"/accounts/{user_id}/orders/{body['order_id']}")
    assert order["status"] == "PERSISTED"
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "15.01"})[0] == 402
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "15.00"


def test_switching_to_sync_waits_for_pending_orders(api, redis_client):
    user_id = api.account(balance="20.00")
    status, body = api("PATCH", f"/accounts/{user_id}", {"deduct_type": "SYNC"})
    assert status == 409 and body["error"]["code"] == "PENDING_ORDERS"
    from hotledger import keys

    redis_client.delete(keys.pending(user_id))  # as if the writer had persisted everything
    assert api("PATCH", f"/accounts/{user_id}", {"deduct_type": "SYNC"})[1]["deduct_type"] == "SYNC"


def test_unknown_account_and_order(api):
    for method, path, body in (
        ("GET", "/accounts/987654", None),
        ("POST", "/accounts/987654/deduct", {"amount": "1.00"}),
        ("POST", "/accounts/987654/recharge", {"amount": "1.00"}),
        ("PATCH", "/accounts/987654", {"threshold": "1.00"}),
    ):
        status, answer = api(method, path, body)
        assert status == 404 and answer["error"]["code"] == "ACCOUNT_NOT_FOUND", (path, answer)
    user_id = api.account()
    status, answer = api("GET", f"/accounts/{user_id}/orders/123")
    assert status == 404 and answer["error"]["code"] == "ORDER_NOT_FOUND"


BAD_AMOUNTS = [
    "-1.00",
    "0",
    "0.00",
    "1.234",
    "1e3",
    "NaN",
    "Infinity",
    "1" + "0" * 30,
    "abc",
    "1; DROP TABLE t_order",
    "' OR 1=1 --",
    "",
]


@pytest.mark.parametrize("amount", BAD_AMOUNTS + [12.5, 10, None, True, ["1.00"], {"v": 1}])
@pytest.mark.parametrize("route", ["deduct", "recharge"])
def test_bad_amounts_are_422_and_change_nothing(api, route, amount):
    user_id = api.account(balance="10.00")
    before = api("GET", f"/accounts/{user_id}")[1]
    status, body = api("POST", f"/accounts/{user_id}/{route}", {"amount": amount})
    assert status == 422 and body["error"]["code"] == "INVALID_AMOUNT" and body["error"]["message"]
    assert api("GET", f"/accounts/{user_id}")[1] == before


@pytest.mark.parametrize(
    "raw,code,status",
    [
        ('{"amount": "1.00"', "MALFORMED_JSON", 400),
        ("not json", "MALFORMED_JSON", 400),
        ("{}", "MISSING_FIELD", 422),
        ('{"amount": "1.00", "extra": 1}', "VALIDATION_ERROR", 422),
        ("[]", "VALIDATION_ERROR", 422),
    ],
)
def test_malformed_bodies(api, raw, code, status):
    user_id = api.account(balance="10.00")
    got_status, body = api("POST", f"/accounts/{user_id}/deduct", raw=raw)
    assert (got_status, body["error"]["code"]) == (status, code)
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "10.00"


def test_form_encoded_body_is_415(api):
    status, body = api(
        "POST", "/accounts", raw="user_name=bob", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert status == 415 and body["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"


@pytest.mark.parametrize(
    "body",
    [
        {"user_name": "x' OR '1'='1"},
        {"user_name": ""},
        {"user_name": 5},
        {"user_name": "ok-name", "deduct_type": "LATER"},
        {"user_name": "ok2", "threshold": "-1"},
    ],
)
def test_bad_account_fields(api, body):
    status, answer = api("POST", "/accounts", body)
    assert status == 422 and answer["error"]["code"] in {"VALIDATION_ERROR", "INVALID_AMOUNT"}


def test_bad_path_ids(api):
    assert api("GET", "/accounts/abc")[0] == 422
    assert api("GET", "/accounts/-1")[0] == 422
    assert api("GET", "/nowhere")[1]["error"]["code"] == "ROUTE_NOT_FOUND"


def test_openapi_document_describes_every_answer(api):
    status, doc = api("GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    deduct = doc["paths"]["/accounts/{user_id}/deduct"]["post"]
    assert {"200", "400", "402", "403", "404", "409", "415", "422", "503"} <= set(deduct["responses"])
    assert "OUTCOME_UNKNOWN" in deduct["responses"]["503"]["description"]
    assert "entry_id" in doc["components"]["schemas"]["ErrorBody"]["properties"]
    assert deduct["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponse")
    assert any(p["name"].lower() == "idempotency-key" and p["in"] == "header" for p in deduct["parameters"])
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    status, html = api("GET", "/swagger")
    assert status == 200 and "openapi.json" in html


SAMPLE_EVENTS = [
    ("api_create_account", {201}),
    ("api_get_account", {200}),
    ("api_patch_account", {200}),
    ("api_recharge", {200}),
    ("api_deduct", {200}),
    ("api_get_order", {404}),
    ("api_bad_amount", {422}),
]


def test_sample_events_run_through_the_handler(api):
    """The files in events/ (for `sam local invoke -e`) are API Gateway events this handler answers,
    pointed at a fresh account instead of account 1."""
    assert sorted(name for name, _ in SAMPLE_EVENTS) == sorted(p.stem for p in EVENTS.glob("api_*.json"))
    user_id = api.account()
    for name, expected in SAMPLE_EVENTS:
        event = json.loads((EVENTS / f"{name}.json").read_text())
        event["path"] = event["path"].replace("/accounts/1", f"/accounts/{user_id}")
        event["pathParameters"] = {"proxy": event["path"].lstrip("/")}
        if name == "api_create_account":  # a name no earlier run took: created, never 409
            event["body"] = json.dumps({**json.loads(event["body"]), "user_name": f"sample-{uuid.uuid4().hex[:12]}"})
        response = api.handler(event, events.LambdaContext("ApiFunction"))
        assert response["statusCode"] in expected, (name, response)


def test_switching_back_to_async_reloads_from_the_db(api):
    user_id = api.account(deduct_type="SYNC", balance="20.00")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "5.00"})[1]["mode"] == "SYNC"
    status, body = api("PATCH", f"/accounts/{user_id}", {"deduct_type": "ASYNC"})
    assert status == 200 and body["deduct_type"] == "ASYNC" and body["balance"] == "15.00"
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "5.00"})
    assert status == 200 and body["mode"] == "ASYNC" and body["balance"] == "10.00"


@pytest.mark.parametrize("stall", ["charge", "ledger_rollback"])
@pytest.mark.single_redis
def test_a_charge_with_an_unknown_outcome_says_so_and_settles_consistently(api, sql, redis_server, monkeypatch, stall):
    """Redis stalls (a real SIGSTOP) during the charge script, or after a publish failure and before the
    rollback: the answer is 503 OUTCOME_UNKNOWN with the entry id, never "nothing charged". Once Redis
    resumes, the order lookup, Redis and the DB agree after the reconciler, whichever way it went."""
    from hotledger.dal.publisher import NotAcknowledged
    from hotledger.ledger.feature import ledger

    user_id = api.account(balance="10.00")
    store = ledger().store

    def redis_stalls() -> None:
        os.kill(redis_server.proc.pid, signal.SIGSTOP)

    if stall == "charge":
        charge = store.apply

        def redis_stalls_then_charge(request):
            redis_stalls()
            return charge(request)

        monkeypatch.setattr(store, "apply", redis_stalls_then_charge)
    else:

        def ack_times_out_and_redis_stalls(key: str, value: bytes) -> None:
            redis_stalls()
            raise NotAcknowledged("no acknowledgement in time")

        monkeypatch.setattr(ledger().durability, "publish", ack_times_out_and_redis_stalls)
    try:
        status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    monkeypatch.undo()
    assert status == 503 and body["error"]["code"] == "OUTCOME_UNKNOWN"
    entry_id = body["error"]["entry_id"]
    assert entry_id in body["error"]["message"]

    reconcile_pass(monkeypatch, age_s=0)  # a whole pass: it reaches this account whatever each run's budget
    status, order = api("GET", f"/accounts/{user_id}/orders/{entry_id}")
    account = api("GET", f"/accounts/{user_id}")[1]
    db_balance = sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,))[0][0]
    if status == 200:  # the charge stood: persisted by the reconciler
        assert order["status"] == "PERSISTED" and order["amount"] == "4.00"
        assert (account["balance"], db_balance) == ("6.00", 600)
    else:  # never made, or taken back by the rollback Redis had queued
        assert order["error"]["code"] == "ORDER_NOT_FOUND"
        assert (account["balance"], db_balance) == ("10.00", 1000)
    assert account["pending_orders"] == 0


def test_a_retry_after_the_first_request_died_republishes_its_charge(api, monkeypatch):
    """The first request charged, then its process died before the broker answered. A retry with the same
    Idempotency-Key, once the record is stale, answers the first outcome and publishes the entry again."""
    from hotledger.ledger.feature import ledger

    durability, store = ledger().durability, ledger().store
    user_id = api.account(balance="10.00")
    headers = {"Idempotency-Key": "died-mid-publish"}

    def process_dies(key: str, value: bytes) -> None:
        raise RuntimeError("the process died here")

    monkeypatch.setattr(durability, "publish", process_dies)
    with pytest.raises(RuntimeError):
        api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"}, headers)
    published = []
    monkeypatch.setattr(durability, "publish", lambda key, value: published.append(json.loads(value)))
    assert (
        api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"}, headers)[1]["error"]["code"]
        == "IDEMPOTENCY_IN_PROGRESS"
    )
    monkeypatch.setattr(store, "idempotency_stale_ms", 0)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"}, headers)
    assert status == 200 and body["balance"] == "7.00"
    assert [str(event["id"]) for event in published] == [body["order_id"]]
    status, again = api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"}, headers)
    assert again == body and len(published) == 1  # acknowledged now: the record is done
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "7.00"


def test_a_sync_charge_whose_commit_answer_is_lost_says_outcome_unknown(api, sql, monkeypatch):
    """The DB committed but the answer to COMMIT was lost: 503 OUTCOME_UNKNOWN with the entry id, and the
    lookup finds the order."""
    import pymysql

    from hotledger.dal import db

    user_id = api.account(balance="10.00", deduct_type="SYNC")
    commit = pymysql.connections.Connection.commit

    def commit_then_lose_the_answer(conn):
        commit(conn)
        raise pymysql.err.OperationalError(2013, "Lost connection to server during query")

    monkeypatch.setattr(db.connection(), "commit", commit_then_lose_the_answer.__get__(db.connection()))
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    monkeypatch.undo()
    assert status == 503 and body["error"]["code"] == "OUTCOME_UNKNOWN"
    status, order = api("GET", f"/accounts/{user_id}/orders/{body['error']['entry_id']}")
    assert status == 200 and order["status"] == "PERSISTED" and order["amount"] == "4.00"
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,))[0][0] == 600


def test_a_new_account_never_inherits_what_redis_kept_of_its_id(api, sql, redis_client, settings):
    """A DB restored or reset while Redis kept its keys hands out account ids Redis still knows: the new account must
    start at 0.00 with nothing pending, not with the old account's cached balance and entries."""
    from hotledger import keys

    (next_id,) = sql(
        "SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 't_user'",
        (settings.db_name,),
    )[0]
    redis_client.hset(
        keys.balance(next_id),
        mapping={"balance": 123456, "v": 180, "threshold": 0, "open": "1", "mode": "ASYNC", "epoch": "old", "ts": 1},
    )
    redis_client.zadd(keys.pending(next_id), {"77": 1})
    user_id = api.account()
    assert user_id == next_id
    status, account = api("GET", f"/accounts/{user_id}")
    assert status == 200 and (account["balance"], account["version"], account["pending_orders"]) == ("0.00", 1, 0), (
        account
    )


def test_an_account_loaded_again_takes_the_open_flag_of_its_newest_pending_entry(api, redis_client):
    """A new account starts closed (balance 0); its first recharge reopens it in Redis. Loaded again before the writer
    persisted the recharge, the cache counts the recharge in its balance and must count it in the open flag too:
    the DB's 'closed at 0' would refuse every deduct of a funded account until the writer caught up."""
    from hotledger import keys

    user_id = api.account(balance="5.00")
    redis_client.delete(keys.balance(user_id))  # lost before the writer ran
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert status == 200, body
    assert api("GET", f"/accounts/{user_id}")[1]["api_open"] is True


def test_an_operators_close_of_an_account_redis_lost_outranks_its_entries_still_pending(api, redis_client, sql):
    """The account's hash is lost while its entries still wait for the writer; an operator closes it (not cached: the
    version is set in the DB). The close must take a version above those entries, or the next load (and the writer)
    would take the newest entry's open flag over it and reopen the account."""
    from hotledger import keys

    user_id = api.account(balance="5.00")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
    redis_client.delete(keys.balance(user_id))
    assert api("PATCH", f"/accounts/{user_id}", {"api_open": False})[0] == 200
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert (status, body["error"]["code"]) == (403, "API_CLOSED")
