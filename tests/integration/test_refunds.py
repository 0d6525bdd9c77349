"""Issue 20, refunds: part or all of one charge (a deduct's order, what a hold captured), in as many refunds as
wanted, never more than was charged in total, under any concurrency and retry; a refund is a credit, spendable once
durable. Through the API handler and the writer function on the real Redis, DB and broker."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import invoke_writer, ledger_records
from hotledger import keys


def _persist(redis_client, *user_ids):
    assert invoke_writer(ledger_records(redis_client, list(user_ids))) == {"batchItemFailures": []}


def _deduct(api, user_id, amount):
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": amount})
    assert status == 200, body
    return body["order_id"]


def _booked_deduct(api, redis_client, user_id, amount):
    """A deduct the writer booked: only such a charge is refundable (CHARGE_NOT_BOOKED before)."""
    order_id = _deduct(api, user_id, amount)
    _persist(redis_client, user_id)
    return order_id


def _refund(api, user_id, order_id, amount, headers=None, what="orders"):
    return api(
        "POST", f"/accounts/{user_id}/{what}/{order_id}/refunds", {"amount": amount, "reason": "support"}, headers
    )


def test_partial_refunds_up_to_the_charge_and_not_a_cent_more(api, redis_client, sql):
    user_id = api.account(balance="20.00")
    order_id = _booked_deduct(api, redis_client, user_id, "10.00")
    status, body = _refund(api, user_id, order_id, "4.00")
    assert status == 201 and {k: body[k] for k in ("order_id", "amount", "refunded_total", "balance")} == {
        "order_id": order_id,
        "amount": "4.00",
        "refunded_total": "4.00",
        "balance": "14.00",
    }
    assert _refund(api, user_id, order_id, "6.00")[1]["refunded_total"] == "10.00"
    status, body = _refund(api, user_id, order_id, "0.01")
    assert (status, body["error"]["code"]) == (409, "REFUND_EXCEEDS_CHARGE")
    account = api("GET", f"/accounts/{user_id}")[1]
    assert (account["balance"], account["held_credits"]) == ("20.00", "0.00")  # durable: spendable
    _persist(redis_client, user_id)
    assert sql("SELECT SUM(amount), COUNT(*) FROM t_refund WHERE charge_id = %s", (int(order_id),)) == ((1000, 2),)
    entries = sql("SELECT type, delta, ref FROM t_entry WHERE user_id = %s ORDER BY seq", (user_id,))
    assert [e for e in entries if e[0] == "refund"] == [
        ("refund", 400, f"order:{order_id}"),
        ("refund", 600, f"order:{order_id}"),
    ]
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((2000,),)


def test_refunds_racing_up_to_the_charge_never_pass_it(api, redis_client, sql):
    user_id = api.account(balance="50.00")
    order_id = _booked_deduct(api, redis_client, user_id, "10.00")
    start = threading.Barrier(16)

    def client(i):
        start.wait()
        return _refund(api, user_id, order_id, "1.00", {"Idempotency-Key": f"race-{i % 13}"})

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(client, range(16)))
    made = {body["refund_id"] for status, body in answers if status == 201}
    refused = [body["error"]["code"] for status, body in answers if status != 201]
    assert len(made) == 10, answers  # 13 keys, three of them sent twice: each key refunds once at most
    assert set(refused) <= {"REFUND_EXCEEDS_CHARGE", "IDEMPOTENCY_IN_PROGRESS"}, refused
    _persist(redis_client, user_id)
    assert sql("SELECT SUM(amount) FROM t_refund WHERE charge_id = %s", (int(order_id),)) == ((1000,),)
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "50.00"


def test_a_key_refunds_once_and_a_failed_publish_refunds_nothing(api, redis_client, monkeypatch):
    from hotledger.dal.publisher import NotAcknowledged
    from hotledger.refunds.feature import refunds

    user_id = api.account(balance="20.00")
    order_id = _booked_deduct(api, redis_client, user_id, "5.00")
    key = {"Idempotency-Key": "refund-1"}
    first = _refund(api, user_id, order_id, "2.00", key)
    assert first[0] == 201 and _refund(api, user_id, order_id, "2.00", key) == first
    status, body = _refund(api, user_id, order_id, "3.00", key)
    assert (status, body["error"]["code"]) == (409, "IDEMPOTENCY_KEY_REUSED")

    def broker_down(key_, event):
        raise NotAcknowledged("no acknowledgement in time")

    monkeypatch.setattr(refunds().durability, "publish", broker_down)
    status, body = _refund(api, user_id, order_id, "3.00", {"Idempotency-Key": "refund-2"})
    assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED")
    monkeypatch.undo()
    status, body = _refund(api, user_id, order_id, "3.00", {"Idempotency-Key": "refund-2"})
    assert status == 201 and body["refunded_total"] == "5.00"  # the failed one left nothing behind
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "20.00"


def test_the_refunded_total_survives_redis_losing_the_account(api, redis_client, sql):
    user_id = api.account(balance="20.00")
    order_id = _booked_deduct(api, redis_client, user_id, "8.00")
    assert _refund(api, user_id, order_id, "5.00")[0] == 201
    _persist(redis_client, user_id)
    redis_client.delete(keys.balance(user_id), keys.refunds(user_id))
    status, body = _refund(api, user_id, order_id, "3.01")
    assert (status, body["error"]["code"]) == (409, "REFUND_EXCEEDS_CHARGE")
    assert _refund(api, user_id, order_id, "3.00")[1]["refunded_total"] == "8.00"


def test_what_a_hold_captured_is_refundable_once_it_ended(api, redis_client, sql):
    user_id = api.account(balance="30.00")
    status, hold = api("POST", f"/accounts/{user_id}/holds", {"amount": "10.00"})
    hold_id = hold["hold_id"]
    status, body = _refund(api, user_id, hold_id, "1.00", what="holds")
    assert (status, body["error"]["code"]) == (409, "HOLD_NOT_ENDED")
    assert api("POST", f"/accounts/{user_id}/holds/{hold_id}/capture", {"amount": "6.00", "final": True})[0] == 200
    _persist(redis_client, user_id)
    status, body = _refund(api, user_id, hold_id, "6.00", what="holds")
    assert status == 201 and body["hold_id"] == hold_id and body["balance"] == "30.00"
    assert _refund(api, user_id, hold_id, "0.01", what="holds")[1]["error"]["code"] == "REFUND_EXCEEDS_CHARGE"
    _persist(redis_client, user_id)
    assert sql("SELECT ref FROM t_entry WHERE user_id = %s AND type = 'refund'", (user_id,)) == ((f"hold:{hold_id}",),)


def test_another_accounts_order_and_bad_input(api):
    alice, bob = api.account(balance="5.00"), api.account(balance="5.00")
    order_id = _deduct(api, alice, "1.00")
    status, body = _refund(api, bob, order_id, "1.00")
    assert (status, body["error"]["code"]) == (404, "ORDER_NOT_FOUND")
    for body, code in (
        ({"amount": "0.00"}, "INVALID_AMOUNT"),
        ({"amount": "1.00", "reason": 5}, "VALIDATION_ERROR"),
        ({}, "MISSING_FIELD"),
        ({"amount": "1.00", "x": 1}, "VALIDATION_ERROR"),
    ):
        status, answer = api("POST", f"/accounts/{alice}/orders/{order_id}/refunds", body)
        assert (status, answer["error"]["code"]) == (422, code), answer
    assert api("GET", f"/accounts/{alice}")[1]["balance"] == "4.00"


def test_refunds_of_a_sync_account_are_decided_and_booked_in_the_db(api, sql):
    user_id = api.account(balance="5.00", deduct_type="SYNC")
    order_id = _deduct(api, user_id, "3.00")
    status, body = _refund(api, user_id, order_id, "2.00")
    assert status == 201 and (body["refunded_total"], body["balance"]) == ("2.00", "4.00")
    status, body = _refund(api, user_id, order_id, "1.01")
    assert (status, body["error"]["code"]) == (409, "REFUND_EXCEEDS_CHARGE")
    assert _refund(api, user_id, order_id, "1.00")[1]["refunded_total"] == "3.00"
    assert sql("SELECT SUM(amount) FROM t_refund WHERE charge_id = %s", (int(order_id),)) == ((300,),)
    assert sql("SELECT type, delta, balance_after FROM t_entry WHERE user_id = %s ORDER BY seq", (user_id,)) == (
        ("recharge", 500, 500),
        ("deduct", -300, 200),
        ("refund", 200, 400),
        ("refund", 100, 500),
    )


@pytest.mark.parametrize("charged", ["1.00"])
def test_a_refund_over_the_balance_limit_is_refused(api, redis_client, charged, monkeypatch):
    from hotledger.refunds.feature import refunds

    user_id = api.account(balance="5.00")
    order_id = _booked_deduct(api, redis_client, user_id, charged)
    monkeypatch.setattr(refunds().store, "max_balance", 400)
    status, body = _refund(api, user_id, order_id, "1.00")
    assert (status, body["error"]["code"]) == (422, "BALANCE_LIMIT")


# issue 31: what a refund may cover -------------------------------------------------------------------------------
def test_a_charge_not_booked_yet_is_not_refunded_until_it_is(api, redis_client, sql):
    """Hole 2: a refund covers only a charge the ledger's books hold. A deduct whose publish and give-back both failed
    (503 OUTCOME_UNKNOWN, its order PENDING) was refundable, and the reconciler then gave the deduct back too: credited
    twice; a final capture still waiting on the broker was refundable, and its publish then failed. Now both wait."""
    user_id = api.account(balance="20.00")
    _persist(redis_client, user_id)
    order_id = _deduct(api, user_id, "5.00")  # acknowledged, its entry not in the books yet
    status, body = _refund(api, user_id, order_id, "5.00")
    assert (status, body["error"]["code"]) == (409, "CHARGE_NOT_BOOKED"), body
    _, hold = api("POST", f"/accounts/{user_id}/holds", {"amount": "3.00"})
    assert (
        api("POST", f"/accounts/{user_id}/holds/{hold['hold_id']}/capture", {"amount": "3.00", "final": True})[0] == 200
    )
    status, body = _refund(api, user_id, hold["hold_id"], "3.00", what="holds")
    assert (status, body["error"]["code"]) == (409, "CHARGE_NOT_BOOKED"), body
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "12.00"  # nothing changed
    _persist(redis_client, user_id)
    assert _refund(api, user_id, order_id, "5.00")[0] == 201
    assert _refund(api, user_id, hold["hold_id"], "3.00", what="holds")[0] == 201
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "20.00"


def test_the_services_own_charges_are_not_refundable_here(api, redis_client, sql):
    """Hole 5: a red packet's debit is given back by the packet's own refund on expiry, a recharge the cap did not
    count: a 20.00 packet from 100.00, refunded on expiry, then refunded again in full here made 120.00."""
    sender = api.account(balance="100.00")
    status, packet = api("POST", "/redpackets", {"sender_id": sender, "total": "20.00", "count": 2})
    assert status == 201, packet
    _persist(redis_client, sender)
    ((debit_id,),) = sql("SELECT debit_order_id FROM t_red_packet WHERE id = %s", (int(packet["packet_id"]),))
    status, body = _refund(api, sender, str(debit_id), "20.00")
    assert (status, body["error"]["code"]) == (409, "NOT_REFUNDABLE"), body
    assert api("GET", f"/accounts/{sender}")[1]["balance"] == "80.00"


def test_a_refund_retried_while_the_writer_books_its_first_attempt_answers_that_attempt(
    api, redis_client, sql, monkeypatch
):
    """Hole 4: the first attempt died after its refund stood; the retry looked in the DB, then in Redis, and the writer
    committed and settled the refund between the two reads: seen in neither, refunded again."""
    from hotledger import runtime
    from hotledger.dal.idempotency import Idempotency
    from hotledger.refunds.store import RefundStore

    user_id = api.account(balance="20.00")
    order_id = _booked_deduct(api, redis_client, user_id, "10.00")
    key = {"Idempotency-Key": "refund-resumed"}
    monkeypatch.setattr(runtime.idempotency(), "lease_ms", 300)

    class Killed(BaseException):
        pass

    def die(*args, **kwargs):
        raise Killed()

    with monkeypatch.context() as dying:
        dying.setattr(Idempotency, "finish", die)
        with pytest.raises(Killed):
            _refund(api, user_id, order_id, "4.00", key)
    read_in_db = RefundStore.stored

    def writer_between_the_reads(self, owner, refund_id):
        found = read_in_db(self, owner, refund_id)
        _persist(redis_client, user_id)  # the writer commits and settles the refund right after this read
        return found

    monkeypatch.setattr(RefundStore, "stored", writer_between_the_reads)
    time.sleep(0.35)  # the dead attempt's lease ran out: the retry takes the key over and resumes its refund
    status, body = _refund(api, user_id, order_id, "4.00", key)
    assert status == 201 and body["refunded_total"] == "4.00", body
    monkeypatch.setattr(RefundStore, "stored", read_in_db)
    _persist(redis_client, user_id)
    assert sql("SELECT COUNT(*), SUM(amount) FROM t_refund WHERE charge_id = %s", (int(order_id),)) == ((1, 400),)


def test_the_books_refuse_a_refund_whose_charge_they_do_not_hold(api, redis_client, sql, own_topic):
    """Issue 31, hole 2: whatever reaches the writer, a refund row of a charge the books do not hold (or past what it
    charged) is refused by the DB's transaction and dead-lettered, never booked."""
    from helpers import records
    from hotledger.ledger.store import pending_entries
    from hotledger.runtime import id_generator

    user_id = api.account(balance="20.00")
    order_id = _booked_deduct(api, redis_client, user_id, "5.00")
    assert _refund(api, user_id, order_id, "5.00")[0] == 201
    (refund,) = [e.to_event() for e in pending_entries(redis_client, user_id) if e.kind == "F"]
    _persist(redis_client, user_id)
    forged = [
        refund.model_copy(update={"id": id_generator().next_id(), "version": refund.version + 1, "refund_of": 999}),
        refund.model_copy(update={"id": id_generator().next_id(), "version": refund.version + 2}),  # past the charge
    ]
    invoke_writer(records(forged, lambda e: str(e.user_id), first_offset=20_000))
    assert sql("SELECT COUNT(*), SUM(amount) FROM t_refund WHERE user_id = %s", (user_id,)) == ((1, 500),)
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE record_key = %s", (str(user_id),)) == ((2,),)


def test_a_refund_retried_under_its_key_once_its_charge_is_booked_is_made(api, redis_client):
    """CHARGE_NOT_BOOKED says "retry in a few seconds": a retry under the same Idempotency-Key, once the charge is
    booked, makes the refund (the wait is not the key's answer for good)."""
    user_id = api.account(balance="20.00")
    _persist(redis_client, user_id)
    _, hold = api("POST", f"/accounts/{user_id}/holds", {"amount": "3.00"})
    assert (
        api("POST", f"/accounts/{user_id}/holds/{hold['hold_id']}/capture", {"amount": "3.00", "final": True})[0] == 200
    )
    key = {"Idempotency-Key": "refund-after-booking"}
    status, body = _refund(api, user_id, hold["hold_id"], "1.00", key, what="holds")
    assert (status, body["error"]["code"]) == (409, "CHARGE_NOT_BOOKED"), body
    _persist(redis_client, user_id)
    status, body = _refund(api, user_id, hold["hold_id"], "1.00", key, what="holds")
    assert status == 201, body


def test_a_capture_booked_before_its_authorize_is_not_refunded_until_the_authorize_is(api, redis_client, sql):
    """After the broker lost its log, a hold's final capture can be booked before its authorize (the reconciler
    persists the older entry later): t_hold then holds the capture alone (created_at 0). A refund of it was made and
    acknowledged, and the books, which refuse a refund of a hold whose authorize they do not hold, dead-lettered it
    and took it back. The refund waits for the authorize (CHARGE_NOT_BOOKED), as the books do."""
    user_id = api.account(balance="20.00")
    _persist(redis_client, user_id)
    _, hold = api("POST", f"/accounts/{user_id}/holds", {"amount": "3.00"})
    assert (
        api("POST", f"/accounts/{user_id}/holds/{hold['hold_id']}/capture", {"amount": "3.00", "final": True})[0] == 200
    )
    authorize, capture = ledger_records(redis_client, [user_id])
    assert invoke_writer([capture]) == {"batchItemFailures": []}  # the capture first
    status, body = _refund(api, user_id, hold["hold_id"], "3.00", what="holds")
    assert (status, body["error"]["code"]) == (409, "CHARGE_NOT_BOOKED"), body
    assert invoke_writer([authorize]) == {"batchItemFailures": []}
    assert _refund(api, user_id, hold["hold_id"], "3.00", what="holds")[0] == 201
    _persist(redis_client, user_id)
    refunds = sql("SELECT COUNT(*), SUM(amount) FROM t_refund WHERE charge_id = %s", (int(hold["hold_id"]),))
    assert refunds == ((1, 300),)
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((2000,),)
