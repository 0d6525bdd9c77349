"""Red packets through the API handler, the writer (MSK events) and the reconciler (EventBridge events)."""

import random
import threading
import time

import pytest

from helpers import broker_records, invoke_writer, ledger_records, lift_rebuild_hold, reconcile_pass, records
from hotledger import errors, keys
from hotledger.dal.db import DatabaseUnavailable, to_ms
from hotledger.dal.publisher import NotAcknowledged
from hotledger.dal.redis_store import RedisOutcomeUnknown, RedisUnavailable
from hotledger.money import format_minor
from hotledger.redpackets.feature import redpackets
from hotledger.redpackets.split import split
from infra.localrt import events


@pytest.mark.parametrize("total, count", [(10000, 10), (100, 100), (101, 100), (1, 1), (999_999, 7), (5000, 1000)])
def test_split_is_exact_and_never_below_a_cent(total, count):
    items = split(total, count, random.Random(7))
    assert len(items) == count and sum(items) == total and min(items) >= 1
    assert items == split(total, count, random.Random(7))  # reproducible from the seed


def test_split_draws_around_the_mean():
    """Double mean: item k is uniform in [1, 2 x the mean left], so the first item averages the overall mean."""
    firsts = [split(10000, 10, random.Random(seed))[0] for seed in range(2000)]
    assert 900 < sum(firsts) / len(firsts) < 1100 and max(firsts) <= 2000


def claim_records(packet_id):
    claims = sorted(redpackets().pending_claims(packet_id), key=lambda c: c.item_id)
    return records(claims, lambda c: f"rp{c.packet_id}", partition=1)


def lose_packet_in_redis(redis_client, packet_id):
    redis_client.delete(
        keys.packet(packet_id),
        keys.packet_unclaimed(packet_id),
        keys.packet_grabbers(packet_id),
        keys.packet_pending(packet_id),
    )


def send(api, sender, total="10.00", count=5, expires_in_s=3600):
    status, body = api(
        "POST", "/redpackets", {"sender_id": sender, "total": total, "count": count, "expires_in_s": expires_in_s}
    )
    assert status == 201, body
    return int(body["packet_id"])


def test_send_grab_persist_and_refund_the_rest_exactly_once(api, sql, redis_client, monkeypatch):
    sender = api.account(balance="100.00")
    grabbers = [api.account() for _ in range(3)]
    packet_id = send(api, sender, "10.00", 5)
    assert api("GET", f"/accounts/{sender}")[1]["balance"] == "90.00"
    amounts = {}
    for user in grabbers:
        status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": user})
        assert status == 200 and body["credit"] == "PENDING", body
        amounts[user] = body["amount"]
        assert api("GET", f"/accounts/{user}")[1]["balance"] == "0.00"  # credited once the DB holds the claim
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabbers[0]})
    assert (status, body["error"]["code"]) == (409, "ALREADY_GRABBED")
    view = api("GET", f"/redpackets/{packet_id}")[1]
    assert (view["claimed"], view["remaining"], view["state"]) == (3, 2, "OPEN")
    assert {g["user_id"]: g["amount"] for g in view["grabs"]} == amounts

    invoke_writer(claim_records(packet_id) * 2)  # delivered twice: persisted once, credited once
    assert {u: api("GET", f"/accounts/{u}")[1]["balance"] for u in grabbers} == amounts
    invoke_writer(ledger_records(redis_client, [sender, *grabbers]))
    assert sql("SELECT COUNT(*) FROM t_red_packet_item WHERE packet_id = %s AND user_id IS NOT NULL", (packet_id,)) == (
        (3,),
    )
    assert redis_client.hlen(keys.packet_pending(packet_id)) == 0

    # expiry: grabs refused, the rest refunded to the sender once, however often the reconciler runs
    redis_client.hset(keys.packet(packet_id), "expires_at", 0)
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": api.account()})
    assert (status, body["error"]["code"]) == (409, "EXPIRED")
    for _ in range(3):
        reconcile_pass(monkeypatch, age_s=0)
    grabbed = sum(int(a.replace(".", "")) for a in amounts.values())
    view = api("GET", f"/redpackets/{packet_id}")[1]
    assert view["state"] == "REFUNDED" and view["refund"] == format_minor(1000 - grabbed)
    sender_balance = api("GET", f"/accounts/{sender}")[1]["balance"]
    assert int(sender_balance.replace(".", "")) == 10000 - grabbed
    invoke_writer(ledger_records(redis_client, [sender]))
    assert sql("SELECT COUNT(*) FROM t_pay WHERE user_id = %s AND idem_key = %s", (sender, f"rprefund{packet_id}")) == (
        (1,),
    )
    assert sql("SELECT SUM(credited) FROM t_red_packet_item WHERE packet_id = %s", (packet_id,)) == ((3,),)
    # a refunded packet leaves Redis after FINISHED_KEYS_TTL_S; a late grab reloads it, answers EXPIRED, retires it again
    assert (
        0 < redis_client.ttl(keys.packet(packet_id)) <= 86_400 and redis_client.ttl(keys.packet_grabbers(packet_id)) > 0
    )
    lose_packet_in_redis(redis_client, packet_id)
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": api.account()})
    assert (status, body["error"]["code"]) == (409, "EXPIRED")
    assert 0 < redis_client.ttl(keys.packet(packet_id)) <= 86_400


def test_sender_short_of_money_gets_402_and_no_packet_opens(api, sql):
    sender = api.account(balance="1.00")
    status, body = api("POST", "/redpackets", {"sender_id": sender, "total": "5.00", "count": 2})
    assert (status, body["error"]["code"]) == (402, "INSUFFICIENT_BALANCE")
    assert sql("SELECT state FROM t_red_packet WHERE sender_id = %s", (sender,)) == (("FAILED",),)
    assert api("GET", f"/accounts/{sender}")[1]["balance"] == "1.00"


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"total": "5.00", "count": 0}, 422, "VALIDATION_ERROR"),
        ({"total": "0.99", "count": 100}, 422, "TOTAL_TOO_SMALL"),
        ({"total": "5.001", "count": 2}, 422, "INVALID_AMOUNT"),
        ({"total": 5, "count": 2}, 422, "INVALID_AMOUNT"),
        ({"count": 2}, 422, "MISSING_FIELD"),
    ],
)
def test_bad_packet_input_is_refused_and_debits_nothing(api, sql, body, status, code):
    sender = api.account(balance="10.00")
    answer = api("POST", "/redpackets", {"sender_id": sender, **body})
    assert (answer[0], answer[1]["error"]["code"]) == (status, code)
    assert api("GET", f"/accounts/{sender}")[1]["balance"] == "10.00"
    assert sql("SELECT COUNT(*) FROM t_red_packet WHERE sender_id = %s", (sender,)) == ((0,),)


def test_unknown_packet_unknown_grabber_empty_packet_and_malformed_json(api):
    sender = api.account(balance="10.00")
    packet_id = send(api, sender, "0.02", 2)
    assert api("POST", "/redpackets/99999999/grab", {"user_id": sender})[1]["error"]["code"] == "PACKET_NOT_FOUND"
    assert api("GET", "/redpackets/99999999")[0] == 404
    assert (
        api("POST", f"/redpackets/{packet_id}/grab", {"user_id": 2**31 - 1})[1]["error"]["code"] == "ACCOUNT_NOT_FOUND"
    )
    status, body = api("POST", f"/redpackets/{packet_id}/grab", raw="{")
    assert (status, body["error"]["code"]) == (400, "MALFORMED_JSON")
    for _ in range(2):
        assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": api.account()})[1]["amount"] == "0.01"
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": api.account()})
    assert (status, body["error"]["code"]) == (409, "EMPTY")


def test_a_failed_publish_puts_the_packet_back(api, monkeypatch):
    sender, grabber = api.account(balance="10.00"), api.account()
    packet_id = send(api, sender, "1.00", 1)

    def broker_down(key, value):
        raise NotAcknowledged("no acknowledgement in time")

    monkeypatch.setattr(redpackets().durability, "publish", broker_down)
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED")
    monkeypatch.undo()
    assert api("GET", f"/accounts/{grabber}")[1]["balance"] == "0.00"
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert status == 200 and body["amount"] == "1.00"


def test_a_claim_rolled_back_but_delivered_late_does_not_cancel_the_next_grab_of_its_item(api, sql, monkeypatch):
    """The broker took the first claim but its acknowledgement timed out: the grab was rolled back and the
    item (the packet's only one) went to the same user's retry. When both events arrive, the late one is
    skipped and the retry is persisted: the verdict belongs to the grab, not to the item."""
    sender, grabber = api.account(balance="10.00"), api.account()
    packet_id = send(api, sender, "1.00", 1)
    delivered = []

    def acknowledgement_lost(key, value):
        delivered.append(value)
        raise NotAcknowledged("no acknowledgement in time")

    monkeypatch.setattr(redpackets().durability, "publish", acknowledgement_lost)
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})[1]["error"]["code"] == "PUBLISH_FAILED"
    monkeypatch.setattr(redpackets().durability, "publish", lambda key, value: delivered.append(value))
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert status == 200 and body["amount"] == "1.00"
    assert (
        invoke_writer([(0, i, f"rp{packet_id}".encode(), value) for i, value in enumerate(delivered)])[
            "batchItemFailures"
        ]
        == []
    )
    assert sql("SELECT user_id, amount FROM t_red_packet_item WHERE packet_id = %s", (packet_id,)) == ((grabber, 100),)
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE record_key = %s", (f"rp{packet_id}",)) == ((0,),)
    assert redpackets().pending_claims(packet_id) == []


def test_a_credit_that_failed_is_made_by_the_reconciler_once(api, sql, redis_client, monkeypatch):
    from hotledger.dal.redis_store import RedisUnavailable

    sender, grabber = api.account(balance="10.00"), api.account()
    packet_id = send(api, sender, "3.00", 1)
    ledger = redpackets().ledger
    recharge = ledger.recharge

    def redis_gone_for_the_credit(*args):
        raise RedisUnavailable("ConnectionError: refused")

    monkeypatch.setattr(ledger, "recharge", redis_gone_for_the_credit)
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert status == 200 and body["credit"] == "PENDING"
    invoke_writer(claim_records(packet_id))  # the claim is stamped; its credit fails
    assert sql("SELECT user_id FROM t_red_packet_item WHERE packet_id = %s", (packet_id,)) == ((grabber,),)
    monkeypatch.setattr(ledger, "recharge", recharge)
    for _ in range(2):
        reconcile_pass(monkeypatch, age_s=0)
        invoke_writer(ledger_records(redis_client, [grabber]))
    assert api("GET", f"/accounts/{grabber}")[1]["balance"] == "3.00"
    assert sql("SELECT COUNT(*) FROM t_pay WHERE user_id = %s", (grabber,)) == ((1,),)
    reconcile_pass(monkeypatch, age_s=0)
    assert sql("SELECT credited FROM t_red_packet_item WHERE packet_id = %s", (packet_id,)) == ((1,),)


def test_one_grabbers_failing_credit_never_blocks_the_others(api, sql, redis_client, monkeypatch):
    """Issue 19 item 7: a credit the ledger refuses (a grabber at the balance limit) is recorded and counted, and the
    writer and the reconciler go on with the other credits, in a stable order."""
    sender = api.account(balance="10.00")
    grabbers = [api.account() for _ in range(4)]
    packet_id = send(api, sender, "4.00", 4)
    for grabber in grabbers:
        assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})[0] == 200
    claims = claim_records(packet_id)  # by item id: the first is the blocked grabber's
    blocked = sorted(redpackets().pending_claims(packet_id), key=lambda c: c.item_id)[0].user_id
    others = [g for g in grabbers if g != blocked]
    ledger = redpackets().ledger
    recharge = ledger.recharge

    def at_the_limit(user_id, amount, idem_key=None):
        if user_id == blocked:
            raise errors.BalanceLimit("the balance would pass the largest allowed")
        return recharge(user_id, amount, idem_key)

    monkeypatch.setattr(ledger, "recharge", at_the_limit)
    assert invoke_writer(claims) == {"batchItemFailures": []}
    invoke_writer(ledger_records(redis_client, others))
    credited = lambda user_id: sql("SELECT COUNT(*) FROM t_pay WHERE user_id = %s", (user_id,))[0][0]  # noqa: E731
    assert [credited(g) for g in others] == [1, 1, 1]
    reports = reconcile_pass(monkeypatch, age_s=0)
    assert sum(r["packets"]["credit_failed"] for r in reports) >= 1, reports
    assert credited(blocked) == 0
    assert sql("SELECT user_id FROM t_red_packet_item WHERE packet_id = %s AND credited = 0", (packet_id,)) == (
        (blocked,),
    )
    monkeypatch.setattr(ledger, "recharge", recharge)  # the cause is gone: the next pass credits it
    reconcile_pass(monkeypatch, age_s=0)
    invoke_writer(ledger_records(redis_client, [blocked]))
    assert credited(blocked) == 1


def test_a_batch_of_claims_stamps_each_item_with_its_own_grabber_and_time(api, sql, monkeypatch):
    """The writer stamps a batch's claims in one statement (PacketTx.stamp_claims): each item gets its own grabber and
    its own claim time, to the millisecond, whatever the claims' order in the batch."""
    sender = api.account(balance="10.00")
    grabbers = [api.account() for _ in range(4)]
    packet_id = send(api, sender, "4.00", 4)
    start = redpackets().clock()
    for n, grabber in enumerate(grabbers):  # a second and a millisecond apart: no two claims share a time
        monkeypatch.setattr(redpackets(), "clock", lambda n=n: start + n * 1_001)
        assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})[0] == 200
    claims = sorted(redpackets().pending_claims(packet_id), key=lambda c: c.item_id, reverse=True)
    assert invoke_writer(records(claims, lambda c: f"rp{c.packet_id}", partition=1)) == {"batchItemFailures": []}
    stamped = sql("SELECT id, user_id, claim_time FROM t_red_packet_item WHERE packet_id = %s", (packet_id,))
    assert {i: (user, to_ms(at)) for i, user, at in stamped} == {c.item_id: (c.user_id, c.ts) for c in claims}


def test_a_packet_redis_lost_is_rebuilt_and_late_claims_are_not_handed_out_again(api, sql, redis_client, monkeypatch):
    sender = api.account(balance="10.00")
    first, second = api.account(), api.account()
    packet_id = send(api, sender, "2.00", 3)
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": first})[0] == 200
    in_flight = claim_records(packet_id)
    lose_packet_in_redis(redis_client, packet_id)
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": second})
    assert (status, body["error"]["code"]) == (503, "RECOVERING")
    assert redis_client.llen(keys.packet_unclaimed(packet_id)) == 3  # the DB does not know the first grab yet
    invoke_writer(in_flight)  # the claim lands during the hold and is taken out of the rebuilt list
    assert redis_client.llen(keys.packet_unclaimed(packet_id)) == 2
    lift_rebuild_hold(redis_client, keys.packet(packet_id))
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": first})[1]["error"]["code"] == "ALREADY_GRABBED"
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": second})[0] == 200
    view = api("GET", f"/redpackets/{packet_id}")[1]
    assert (view["claimed"], view["remaining"]) == (2, 1)


def test_a_claim_committed_while_a_rebuild_reads_the_db_is_not_handed_out_again(api, redis_client, monkeypatch):
    """The rebuild read the DB before the claim's commit and writes Redis after it: the writer waits on the
    packet row, so its settle finds the rebuilt list and takes the item out."""
    sender, first, second = api.account(balance="10.00"), api.account(), api.account()
    packet_id = send(api, sender, "2.00", 2)
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": first})[0] == 200
    in_flight = claim_records(packet_id)
    lose_packet_in_redis(redis_client, packet_id)
    cache = redpackets().cache
    load_into_redis, writer_done = cache.load, threading.Event()

    def writer_commits_between_read_and_load(*args, **kwargs):
        threading.Thread(target=lambda: (invoke_writer(in_flight), writer_done.set())).start()
        writer_done.wait(1.0)  # without the packet row lock the writer commits and settles in here
        return load_into_redis(*args, **kwargs)

    monkeypatch.setattr(cache, "load", writer_commits_between_read_and_load)
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": second})[1]["error"]["code"] == "RECOVERING"
    assert writer_done.wait(30)
    assert redis_client.llen(keys.packet_unclaimed(packet_id)) == 1
    assert redis_client.hexists(keys.packet_grabbers(packet_id), first)


def test_claims_whose_event_was_lost_are_persisted_by_the_reconciler(api, sql, monkeypatch):
    sender, grabber = api.account(balance="10.00"), api.account()
    packet_id = send(api, sender, "2.00", 2)
    status, grab = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert status == 200
    reports = reconcile_pass(monkeypatch, age_s=0)  # the broker lost the claim: nothing but Redis holds it
    assert sum(report["packets"]["compensated"] for report in reports) >= 1
    assert sql(
        "SELECT user_id, amount FROM t_red_packet_item WHERE packet_id = %s AND user_id IS NOT NULL", (packet_id,)
    ) == ((grabber, int(grab["amount"].replace(".", ""))),)


def test_the_delay_queue_refunds_a_packet_at_its_expiry(api, sql, redis_client):
    from delay_drainer.app import handler as drain

    sender, grabber = api.account(balance="10.00"), api.account()
    packet_id = send(api, sender, "3.00", 3, expires_in_s=1)
    status, grab = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert status == 200
    invoke_writer(claim_records(packet_id))  # the claim is in the DB: nothing in flight at expiry
    time.sleep(1.1)
    drain(events.scheduled(), events.LambdaContext("DelayDrainerFunction", timeout_s=4))
    view = api("GET", f"/redpackets/{packet_id}")[1]
    refund = 300 - int(grab["amount"].replace(".", ""))
    assert view["state"] == "REFUNDED" and view["refund"] == format_minor(refund)
    assert api("GET", f"/accounts/{sender}")[1]["balance"] == format_minor(700 + refund)


def _charge_then(failure, monkeypatch):
    """The ledger charges the packet's debit, then raises: a failure after the debit stood."""
    ledger = redpackets().ledger
    charge = ledger.deduct

    def debit_then_fail(user_id, amount, idem_key=None):
        charge(user_id, amount, idem_key)
        raise failure

    monkeypatch.setattr(ledger, "deduct", debit_then_fail)
    return lambda: monkeypatch.setattr(ledger, "deduct", charge)


def _sender_balance(api, sender):
    return api("GET", f"/accounts/{sender}")[1]["balance"]


@pytest.mark.parametrize(
    "failure",
    [
        RedisOutcomeUnknown("the read timed out after Redis ran the script"),
        RedisUnavailable("connection refused on the republish"),
        DatabaseUnavailable("server has gone away"),
    ],
)
def test_a_packet_whose_debit_stood_before_the_ledger_raised_is_never_failed_and_the_reconciler_opens_it(
    api, sql, monkeypatch, failure
):
    """Before: the ledger's exception was taken for 'nothing happened': 503 SERVICE_UNAVAILABLE, the packet FAILED,
    the sender's 10.00 gone for good (no reconciler step looked at it)."""
    sender, grabber = api.account(balance="100.00"), api.account()
    restore = _charge_then(failure, monkeypatch)
    status, body = api("POST", "/redpackets", {"sender_id": sender, "total": "10.00", "count": 2, "expires_in_s": 3600})
    assert (status, body["error"]["code"]) == (503, "OUTCOME_UNKNOWN"), body
    packet_id = int(body["error"]["packet_id"])
    assert api("GET", f"/redpackets/{packet_id}")[1]["state"] == "CREATING"
    restore()
    for _ in range(2):  # the debit again under its key: replayed, not charged twice; the packet opened once
        reconcile_pass(monkeypatch, age_s=0)
        assert api("GET", f"/redpackets/{packet_id}")[1]["state"] == "OPEN"
        assert _sender_balance(api, sender) == "90.00"
        assert sql(
            "SELECT COUNT(*), SUM(amount) FROM t_order WHERE user_id = %s AND idem_key = %s", (sender, f"rp{packet_id}")
        ) == ((1, 1000),)
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})[0] == 200


def test_a_packet_left_failed_with_its_sender_debited_is_refunded_in_full_exactly_once(api, sql, monkeypatch):
    """A FAILED packet whose debit stood after all (the ledger answered a refusal after charging; or an earlier
    release marked it FAILED on an exception). Before: nothing ever looked at FAILED packets: the 10.00 stayed gone."""
    sender = api.account(balance="100.00")
    restore = _charge_then(errors.ApiClosed("refused after the charge"), monkeypatch)
    status, body = api("POST", "/redpackets", {"sender_id": sender, "total": "10.00", "count": 3, "expires_in_s": 3600})
    assert (status, body["error"]["code"]) == (403, "API_CLOSED")
    restore()
    ((packet_id, state),) = sql("SELECT id, state FROM t_red_packet WHERE sender_id = %s", (sender,))
    assert state == "FAILED" and _sender_balance(api, sender) == "90.00"
    for _ in range(3):
        reconcile_pass(monkeypatch, age_s=0)
        view = api("GET", f"/redpackets/{packet_id}")[1]
        assert (view["state"], view["refund"]) == ("REFUNDED", "10.00")
        assert _sender_balance(api, sender) == "100.00"
    assert sql(
        "SELECT COUNT(*), SUM(pay) FROM t_pay WHERE user_id = %s AND idem_key = %s", (sender, f"rprefund{packet_id}")
    ) == ((1, 1000),)


def test_a_packet_failed_by_a_refusal_is_never_refunded(api, sql, monkeypatch):
    sender = api.account(balance="5.00")
    status, body = api("POST", "/redpackets", {"sender_id": sender, "total": "10.00", "count": 3, "expires_in_s": 3600})
    assert (status, body["error"]["code"]) == (402, "INSUFFICIENT_BALANCE")
    reconcile_pass(monkeypatch, age_s=0)
    assert sql("SELECT state, refund FROM t_red_packet WHERE sender_id = %s", (sender,)) == (("FAILED", None),)
    assert _sender_balance(api, sender) == "5.00"


def test_a_claim_the_db_refuses_after_a_redis_loss_is_never_credited_and_the_packet_pays_out_its_total(
    api, sql, redis_client, monkeypatch, capsys
):
    """Redis is lost while the first grabber's acknowledged claim is still on its way to the writer; the rebuilt
    packet's hold is lifted by hand (the window a hold must close) and its one item goes to a second grabber,
    whose claim lands first. The late claim is refused by the DB: its grabber is never credited, and the
    packet pays out its total, not twice its total."""
    packet_id, first, second, late_claim = _a_late_claim_and_a_regrab(api, redis_client)
    invoke_writer(claim_records(packet_id))  # its credit waits: the grabber's account was rebuilt, and held too
    lift_rebuild_hold(redis_client, keys.balance(second))
    capsys.readouterr()
    invoke_writer(late_claim)
    _refused_loudly_and_paid_once(sql, redis_client, monkeypatch, capsys, packet_id, paid=second, refused=first)
    assert api("GET", f"/accounts/{first}")[1]["balance"] == "0.00"


def _a_late_claim_and_a_regrab(api, redis_client):
    """(packet id, first grabber, second grabber, the first's claim record): Redis is lost while the first
    grabber's acknowledged claim of the packet's one item is on its way to the writer, and the rebuilt packet's hold
    lifted by hand (the window a hold must close) hands the item to the second grabber."""
    sender, first, second = api.account(balance="10.00"), api.account(), api.account()
    packet_id = send(api, sender, "1.00", 1)
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": first})[0] == 200
    late_claim = claim_records(packet_id)
    invoke_writer(ledger_records(redis_client, [sender, first, second]))  # only the claim lags behind
    redis_client.flushall()
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": second})
    assert (status, body["error"]["code"]) == (503, "RECOVERING")
    lift_rebuild_hold(redis_client, keys.packet(packet_id))
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": second})[0] == 200
    return packet_id, first, second, late_claim


def _refused_loudly_and_paid_once(sql, redis_client, monkeypatch, capsys, packet_id, paid, refused):
    """The writer refused one claim of the item with the window's alarm and a dead letter; once the reconciler has
    credited what waited, the item paid its grabber once and the refused grabber nothing."""
    assert '"LateChangesRefused":[1.0]' in capsys.readouterr().out  # the window's alarm
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE record_key = %s", (f"rp{packet_id}",)) == ((1,),)
    if redis_client.exists(keys.balance(paid)):
        lift_rebuild_hold(redis_client, keys.balance(paid))
    for _ in range(2):
        reconcile_pass(monkeypatch, age_s=0)
        invoke_writer(ledger_records(redis_client, [paid, refused]))
    (item_id,) = [i for (i,) in sql("SELECT id FROM t_red_packet_item WHERE packet_id = %s", (packet_id,))]
    assert sql("SELECT user_id, pay FROM t_pay WHERE idem_key = %s", (f"rp{item_id}",)) == ((paid, 100),)
    balances = dict(sql("SELECT user_id, balance FROM t_account WHERE user_id IN (%s, %s)", (paid, refused)))
    assert balances == {paid: 100, refused: 0}


def test_a_late_claim_and_the_regrab_of_its_item_in_one_batch_pay_once_and_refuse_the_other_loudly(
    api, sql, redis_client, monkeypatch, capsys
):
    """As above, but the late claim and the second grabber's claim of the same item reach the writer in one batch:
    the first in the batch takes the item, and the other is refused as a claim of a taken item (dead letter and the
    window's alarm), as it is when the two come in two batches. Both were judged against the item as locked before
    the batch, so both were fresh: the second was settled as written, its grabber told 200 and never paid, silently."""
    packet_id, first, second, late_claim = _a_late_claim_and_a_regrab(api, redis_client)
    regrab = [(p, offset + len(late_claim), k, v) for p, offset, k, v in claim_records(packet_id)]
    capsys.readouterr()
    invoke_writer(late_claim + regrab)  # the winner's credit waits: its account was rebuilt, and held too
    _refused_loudly_and_paid_once(sql, redis_client, monkeypatch, capsys, packet_id, paid=first, refused=second)


def test_a_packet_redis_lost_hands_out_nothing_until_the_claims_acknowledged_before_the_loss_are_in_the_db(
    api, sql, redis_client, own_topic, monkeypatch
):
    """The writer lags past REBUILD_HOLD_S: the rebuilt packet keeps answering RECOVERING until the writer has
    applied the log as it was when the rebuild happened, so the item acknowledged to the first grabber is never
    handed out again and no answered grab is refused by the DB."""
    sender, first, second = api.account(balance="10.00"), api.account(), api.account()
    packet_id = send(api, sender, "1.00", 1)
    invoke_writer(broker_records())  # the sender's money is in the DB; from here the writer lags
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": first})[0] == 200
    redis_client.flushall()
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": second})[1]["error"]["code"] == "RECOVERING"
    for _ in range(3):  # REBUILD_HOLD_S is over, the writer still lags: the hold stays
        lift_rebuild_hold(redis_client, keys.packet(packet_id), log_too=False)
        status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": second})
        assert (status, body["error"]["code"]) == (503, "RECOVERING"), body
    invoke_writer(broker_records())  # the writer catches up: the first claim lands, its grabber is credited
    lift_rebuild_hold(redis_client, keys.packet(packet_id), log_too=False)
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": second})
    assert (status, body["error"]["code"]) == (409, "EMPTY"), body
    # the first grabber's account, rebuilt by its credit, held the credit (RECOVERING) for REBUILD_HOLD_S: over, its
    # log hold lifts for real (the writer applied this topic's log), and the reconciler credits the grab
    lift_rebuild_hold(redis_client, keys.balance(first), log_too=False)
    reconcile_pass(monkeypatch, age_s=0)
    invoke_writer(broker_records())
    assert sql("SELECT user_id FROM t_red_packet_item WHERE packet_id = %s", (packet_id,)) == ((first,),)
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE record_key = %s", (f"rp{packet_id}",)) == ((0,),)
    assert sql(
        "SELECT user_id, balance FROM t_account WHERE user_id IN (%s, %s) ORDER BY user_id", (first, second)
    ) == ((first, 100), (second, 0))


def test_a_packet_whose_debit_is_not_settled_is_not_open_to_grabs_nor_refunded(api, monkeypatch):
    """The sender's debit answered OUTCOME_UNKNOWN: the packet stays CREATING until the reconciler settles it; a grab
    meanwhile is refused PACKET_NOT_OPEN and its expiry waits (redpacket_grab's and redpacket_expire's not_open)."""
    from hotledger.redpackets.service import Expiry

    sender, grabber = api.account(balance="10.00"), api.account()
    ledger = redpackets().ledger

    def debit_outcome_unknown(*args, **kwargs):
        raise errors.ChargeOutcomeUnknown("Redis did not answer the charge")

    monkeypatch.setattr(ledger, "deduct", debit_outcome_unknown)
    status, body = api("POST", "/redpackets", {"sender_id": sender, "total": "2.00", "count": 2, "expires_in_s": 1})
    assert (status, body["error"]["code"]) == (503, "OUTCOME_UNKNOWN"), body
    packet_id = int(body["error"]["packet_id"])
    monkeypatch.undo()
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert (status, body["error"]["code"]) == (409, "PACKET_NOT_OPEN"), body
    assert redpackets().expire(packet_id, redpackets().clock() + 60_000) is Expiry.NOT_YET
