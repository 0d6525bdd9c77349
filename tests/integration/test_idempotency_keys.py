"""Every money- or stock-moving POST takes an Idempotency-Key (issue 10, item 3), through the API handler with real
Redis, DB and broker: the same key and body answer the first answer (status and body), another body 409
IDEMPOTENCY_KEY_REUSED, and the effect (a debit, a unit of stock, a grab, a payment) happens once. Client keys live in
a namespace of their own: a client key spelled like the service's own keys (payorder<id>, rp<id>) never meets them.
"""

import time
import uuid

import pytest


def key() -> dict:
    return {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}


def balance(api, user_id: int) -> str:
    return api("GET", f"/accounts/{user_id}")[1]["balance"]


def new_voucher(api, stock: int = 5, per_user_limit: int = 2) -> str:
    now = int(time.time() * 1000)
    status, body = api(
        "POST",
        "/vouchers",
        {
            "title": "idem",
            "stock": stock,
            "begin_at": now - 1000,
            "end_at": now + 3_600_000,
            "per_user_limit": per_user_limit,
        },
    )
    assert status == 201, body
    return body["voucher_id"]


def test_a_red_packet_retried_with_its_key_debits_once_and_answers_the_same_packet(api):
    sender = api.account(balance="10.00")
    headers = key()
    request = {"sender_id": sender, "total": "4.00", "count": 2}
    first = api("POST", "/redpackets", request, headers)
    assert first[0] == 201, first
    assert api("POST", "/redpackets", request, headers) == first
    assert balance(api, sender) == "6.00"
    status, body = api("POST", "/redpackets", {**request, "total": "5.00"}, headers)
    assert status == 409 and body["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert balance(api, sender) == "6.00"


def test_a_red_packet_refusal_is_the_keys_answer(api):
    sender = api.account(balance="1.00")
    headers = key()
    request = {"sender_id": sender, "total": "4.00", "count": 2}
    first = api("POST", "/redpackets", request, headers)
    assert first[0] == 402
    assert api("POST", f"/accounts/{sender}/recharge", {"amount": "10.00"})[0] == 200
    assert api("POST", "/redpackets", request, headers) == first
    assert balance(api, sender) == "11.00"


def test_a_voucher_order_retried_with_its_key_answers_the_same_order_and_takes_one_unit(api):
    voucher_id = new_voucher(api, stock=5, per_user_limit=2)
    buyer = api.account()
    headers = key()
    first = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": buyer}, headers)
    assert first[0] == 200, first
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": buyer}, headers) == first
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 4
    # another key is another order (the per-user limit is 2)
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": buyer}, key())[1]["seq"] == 2


def test_a_grab_retried_with_its_key_answers_the_same_item(api):
    sender, grabber = api.account(balance="10.00"), api.account()
    packet_id = api("POST", "/redpackets", {"sender_id": sender, "total": "4.00", "count": 2})[1]["packet_id"]
    headers = key()
    first = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber}, headers)
    assert first[0] == 200, first
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber}, headers) == first
    without_key = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert without_key[0] == 409 and without_key[1]["error"]["code"] == "ALREADY_GRABBED"


def test_a_new_key_for_a_one_per_user_voucher_answers_the_buyers_order_before_and_after_the_db_has_it(api):
    """(voucher, user) is a one-per-user order's natural key. Before: a new key got 409 ALREADY_ORDERED while the
    order was pending in Redis and 200 with the order once the DB held it: two answers to one question."""
    from helpers import invoke_writer
    from integration.test_vouchers import order_records

    voucher_id = new_voucher(api, stock=5, per_user_limit=1)
    buyer = api.account()
    first = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": buyer}, key())
    assert first[0] == 200, first
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": buyer}, key()) == first  # pending in Redis
    assert invoke_writer(order_records(int(voucher_id))) == {"batchItemFailures": []}
    assert api("GET", f"/vouchers/{voucher_id}/orders/{first[1]['order_id']}")[1]["status"] == "PERSISTED"
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": buyer}, key()) == first  # in the DB
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 4
    without_key = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": buyer})
    assert without_key[0] == 409 and without_key[1]["error"]["code"] == "ALREADY_ORDERED"


def test_a_new_key_for_a_grab_answers_the_grabbers_item_before_and_after_the_db_has_its_claim(api):
    """(packet, user) is a grab's natural key: a keyed grab by a user holding an item answers that item, from Redis
    while the claim is pending and once the DB holds it."""
    from helpers import invoke_writer
    from integration.test_writer_poison import claim_records

    sender, grabber = api.account(balance="10.00"), api.account()
    packet_id = api("POST", "/redpackets", {"sender_id": sender, "total": "4.00", "count": 2})[1]["packet_id"]
    first = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber}, key())
    assert first[0] == 200, first
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber}, key()) == first  # pending in Redis
    assert invoke_writer(claim_records(int(packet_id))) == {"batchItemFailures": []}
    assert api("GET", f"/redpackets/{packet_id}")[1]["claimed"] == 1
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber}, key()) == first  # in the DB


def test_a_payment_order_created_with_a_key_is_created_once(api):
    user = api.account(balance="10.00")
    headers = key()
    request = {"user_id": user, "amount": "3.00", "close_in_s": 600}
    first = api("POST", "/orders", request, headers)
    assert first[0] == 201, first
    assert api("POST", "/orders", request, headers) == first


def test_pay_retried_with_its_key_answers_paid_once_and_close_replays_its_refusal(api):
    user = api.account(balance="10.00")
    order_id = api("POST", "/orders", {"user_id": user, "amount": "3.00", "close_in_s": 600})[1]["order_id"]
    pay, close = key(), key()
    first = api("POST", f"/orders/{order_id}/pay", None, pay)
    assert first[0] == 200 and first[1]["state"] == "PAID", first
    assert api("POST", f"/orders/{order_id}/pay", None, pay) == first
    assert balance(api, user) == "7.00"
    refused = api("POST", f"/orders/{order_id}/close", None, close)
    assert refused[0] == 409 and refused[1]["error"]["code"] == "ORDER_PAID"
    assert api("POST", f"/orders/{order_id}/close", None, close) == refused
    # the same key on another route is another request
    status, body = api("POST", f"/orders/{order_id}/close", None, pay)
    assert status == 409 and body["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_a_client_key_spelled_like_a_payment_orders_key_neither_replays_nor_blocks_its_payment(api, deduct_type):
    user = api.account(balance="10.00", deduct_type=deduct_type)
    order_id = api("POST", "/orders", {"user_id": user, "amount": "3.00", "close_in_s": 600})[1]["order_id"]
    spoof = {"Idempotency-Key": f"payorder{order_id}"}
    # the client's refused deduct under that spelling must not become the order's refusal
    refused = api("POST", f"/accounts/{user}/deduct", {"amount": "50.00"}, spoof)
    assert refused[0] == 402
    status, body = api("POST", f"/orders/{order_id}/pay")
    assert status == 200 and body["state"] == "PAID", body
    assert balance(api, user) == "7.00"
    # and a client deduct with the same spelling and the order's amount is a charge of its own, not the order's replay
    status, body = api(
        "POST", f"/accounts/{user}/deduct", {"amount": "3.00"}, {"Idempotency-Key": f"payorder{order_id}x"}
    )
    assert status == 200
    other = api("POST", "/orders", {"user_id": user, "amount": "1.00", "close_in_s": 600})[1]["order_id"]
    charged = api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, {"Idempotency-Key": f"payorder{other}"})
    assert charged[0] == 200
    assert balance(api, user) == "3.00"
    status, body = api("POST", f"/orders/{other}/pay")
    assert status == 200 and body["state"] == "PAID", body
    assert balance(api, user) == "2.00"  # the order's own deduct, not the client's charge replayed


# the record itself (layers/lua/idem_*.lua on a real Redis) --------------------------------------------------------
def test_the_record_holds_a_key_in_flight_until_its_lease_ends_and_only_its_holder_answers(redis_client):
    from hotledger.dal.idempotency import BeginStatus, Idempotency, record_key
    from hotledger.dal.redis_store import lua

    record = Idempotency(lua(), ttl_s=60, lease_ms=300)
    scope, k = "account:77", f"k-{uuid.uuid4().hex}"
    first = record.begin(scope, k, "fp1")
    assert first.status is BeginStatus.NEW
    assert record.begin(scope, k, "fp1").status is BeginStatus.RUNNING
    assert record.begin(scope, k, "fp2").status is BeginStatus.CONFLICT
    time.sleep(0.35)  # the first attempt died holding it: the next one takes it over
    second = record.begin(scope, k, "fp1")
    assert second.status is BeginStatus.NEW
    assert record.finish(scope, k, first.token, 200, '{"late":1}') is False  # the dead attempt cannot answer any more
    assert record.note(scope, k, first.token, "late") is False  # nor leave a recovery point
    record.abandon(scope, k, first.token)  # nor give the key back from under its new holder
    assert record.begin(scope, k, "fp1").status is BeginStatus.RUNNING
    assert record.finish(scope, k, second.token, 201, '{"ok":1}') is True
    replay = record.begin(scope, k, "fp1")
    assert (replay.status, replay.answer_status, replay.body) == (BeginStatus.REPLAY, 201, '{"ok":1}')
    assert 0 < redis_client.ttl(record_key(scope, k)) <= 60
    third = record.begin(scope, f"{k}-b", "fp1")
    record.abandon(scope, f"{k}-b", third.token)  # a 503: the key is given back
    assert record.begin(scope, f"{k}-b", "fp2").status is BeginStatus.NEW


class Killed(BaseException):
    """The process dies here: nothing after it runs (not even an except Exception)."""


@pytest.mark.parametrize("dies_in", ["finish", "deduct"])
def test_a_red_packet_whose_first_attempt_died_before_its_answer_is_resumed_not_sent_twice(api, monkeypatch, dies_in):
    """Killed after the debit (before the answer was recorded), or after the packet row and before the debit."""
    from hotledger import runtime
    from hotledger.dal.idempotency import Idempotency
    from hotledger.ledger.service import Ledger

    sender = api.account(balance="10.00")
    headers = key()
    request = {"sender_id": sender, "total": "4.00", "count": 2}
    monkeypatch.setattr(runtime.idempotency(), "lease_ms", 300)

    def die(*args, **kwargs):
        raise Killed()

    with monkeypatch.context() as dying:
        dying.setattr(Idempotency if dies_in == "finish" else Ledger, dies_in, die)
        with pytest.raises(Killed):
            api("POST", "/redpackets", request, headers)
    assert balance(api, sender) == ("6.00" if dies_in == "finish" else "10.00")
    status, body = api("POST", "/redpackets", request, headers)
    assert status == 409 and body["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS"
    time.sleep(0.35)  # the dead attempt's lease ran out: the retry takes the key over and resumes its packet
    status, body = api("POST", "/redpackets", request, headers)
    assert status == 201, body
    assert balance(api, sender) == "6.00"  # one debit, one packet
    assert api("GET", f"/redpackets/{body['packet_id']}")[1]["state"] == "OPEN"
    assert api("POST", "/redpackets", request, headers) == (status, body)


def test_a_grab_whose_first_attempt_died_before_its_answer_answers_the_item_it_took(api, monkeypatch):
    from hotledger import runtime
    from hotledger.dal.idempotency import Idempotency

    sender, grabber = api.account(balance="10.00"), api.account()
    packet_id = api("POST", "/redpackets", {"sender_id": sender, "total": "4.00", "count": 2})[1]["packet_id"]
    headers = key()
    monkeypatch.setattr(runtime.idempotency(), "lease_ms", 300)

    def die(*args, **kwargs):
        raise Killed()

    with monkeypatch.context() as dying:  # grabbed, then killed before the answer was recorded
        dying.setattr(Idempotency, "finish", die)
        with pytest.raises(Killed):
            api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber}, headers)
    time.sleep(0.35)
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber}, headers)
    assert status == 200, body
    grabs = api("GET", f"/redpackets/{packet_id}")[1]["grabs"]
    assert grabs == [{"user_id": grabber, "amount": body["amount"]}]
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber}, headers) == (status, body)


def test_a_request_that_lost_its_key_while_the_db_stalled_stops_before_a_second_packet(api, sql, monkeypatch):
    """Issue 19 item 3: the first attempt's recovery point stalled in the DB past its lease; a retry took the key over
    and sent the packet; the first then went on (remember answered False, unchecked) and sent a second packet,
    debiting the sender twice. The holder of the lease is the only writer of the key's record and answer."""
    import threading

    from hotledger import runtime
    from hotledger.dal import db

    sender = api.account(balance="10.00")
    headers = key()
    request = {"sender_id": sender, "total": "4.00", "count": 2}
    monkeypatch.setattr(runtime.idempotency(), "lease_ms", 300)
    stalled, go = threading.Event(), threading.Event()
    execute = db.execute

    def stalling_first_note(statement, args=None, *rest, **kw):
        if "t_route_key" in statement and "note" in statement and not stalled.is_set():
            stalled.set()
            go.wait(10)  # the DB stalls past the lease
        return execute(statement, args, *rest, **kw)

    monkeypatch.setattr(db, "execute", stalling_first_note)
    first: list = []
    attempt = threading.Thread(target=lambda: first.append(api("POST", "/redpackets", request, headers)))
    attempt.start()
    assert stalled.wait(10)
    time.sleep(0.4)  # the first attempt's lease ran out: the retry takes the key over
    status, body = api("POST", "/redpackets", request, headers)
    go.set()
    attempt.join(10)
    assert status == 201, body
    # the first attempt either stopped (409: the key is no longer its own) or finished the retry's one packet
    assert first and (first[0][0] == 409 or first[0] == (status, body)), first
    assert sql("SELECT COUNT(*) FROM t_red_packet WHERE sender_id = %s", (sender,)) == ((1,),)
    assert balance(api, sender) == "6.00"  # debited once
    assert api("POST", "/redpackets", request, headers) == (status, body)


def test_a_route_key_redis_forgot_is_answered_from_the_db_for_each_kind_of_request(api, redis_client):
    """The fallbacks after a Redis loss, each answer they can give (issue 19): the DB's record of a route key answers
    the same request with its first answer, another body or another route under the key 409 IDEMPOTENCY_KEY_REUSED,
    and nothing is made twice."""
    from hotledger.dal.idempotency import record_key

    sender = api.account(balance="10.00")
    headers = key()
    request = {"sender_id": sender, "total": "2.00", "count": 2}
    first = api("POST", "/redpackets", request, headers)
    assert first[0] == 201, first
    redis_client.delete(record_key(f"account:{sender}", headers["Idempotency-Key"]))  # Redis lost the record
    assert api("POST", "/redpackets", request, headers) == first  # the same request: the DB's answer
    redis_client.delete(record_key(f"account:{sender}", headers["Idempotency-Key"]))
    status, body = api("POST", "/redpackets", {**request, "total": "3.00"}, headers)  # another body
    assert (status, body["error"]["code"]) == (409, "IDEMPOTENCY_KEY_REUSED"), body
    redis_client.delete(record_key(f"account:{sender}", headers["Idempotency-Key"]))
    status, body = api(
        "POST", "/orders", {"user_id": sender, "amount": "2.00", "close_in_s": 60}, headers
    )  # another route
    assert (status, body["error"]["code"]) == (409, "IDEMPOTENCY_KEY_REUSED"), body
    assert balance(api, sender) == "8.00"  # one packet, one debit
