"""A charge answered PUBLISH_FAILED ("nothing was changed") is never persisted, whatever Redis loses and however
late or old its event is (issue 10, items 7 and 9), through the API handler, the writer handler and real
Redis, DB and broker. The publish is made to time out after the broker really took the event ("timed out but
arrived"), the case where the event reaches the writer after the API rolled the charge back.
"""

import json

import pytest

from helpers import invoke_writer, ledger_records, records
from hotledger import keys
from hotledger.dal.publisher import NotAcknowledged
from hotledger.outbox.events import LedgerEvent


def _unacknowledged(monkeypatch, service):
    """Once called: the broker takes every event of `service()` but its acknowledgement is lost; returns (the fake
    publish, the events the broker took). With `publish.then(event)`, something happens after the broker took
    the event and before the API learns of the failure."""

    def start():
        durability = service().durability
        real, taken = durability.publish, []

        def publish(key, value):
            real(key, value)
            event = json.loads(value)
            taken.append(event)
            publish.then(event)
            raise NotAcknowledged("no acknowledgement in time")

        publish.then = lambda event: None
        monkeypatch.setattr(durability, "publish", publish)
        return publish, taken

    return start


@pytest.fixture
def arrived_unacknowledged(monkeypatch):
    """For ledger charges: see _unacknowledged."""
    from hotledger.ledger.feature import ledger

    return _unacknowledged(monkeypatch, ledger)


def forget_account(redis_client, user_id: int) -> None:
    """Redis loses everything it held of this account (cache, entries, fate keys), as after a restart empty or a
    failover to a replica that had not received them."""
    lost = list(redis_client.scan_iter(match=f"user:*{keys.tag(str(user_id))}*", count=1000))
    assert lost
    redis_client.delete(*lost)


def deliver(events: list[dict]) -> None:
    """The writer gets these events from the broker (late, or replayed)."""
    parsed = [LedgerEvent.model_validate(e) for e in events]
    assert invoke_writer(records(parsed, lambda e: str(e.user_id), first_offset=700)) == {"batchItemFailures": []}


def persisted(sql, user_id: int) -> tuple:
    return sql(
        "SELECT (SELECT COUNT(*) FROM t_order WHERE user_id = %s), (SELECT balance FROM t_account WHERE user_id = %s)",
        (user_id, user_id),
    )[0]


def funded(api, redis_client) -> int:
    """An account holding 10.00, in Redis and in the DB (its recharge persisted)."""
    user_id = api.account(balance="10.00")
    assert invoke_writer(ledger_records(redis_client, [user_id])) == {"batchItemFailures": []}
    return user_id


def publish_failed(api, user_id: int, amount: str = "4.00") -> None:
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": amount})
    assert status == 503 and body["error"]["code"] == "PUBLISH_FAILED", body


def test_a_late_event_after_redis_lost_everything_is_not_persisted(api, redis_client, sql, arrived_unacknowledged):
    user_id = funded(api, redis_client)
    _, taken = arrived_unacknowledged()
    publish_failed(api, user_id)
    forget_account(redis_client, user_id)
    deliver(taken)
    assert persisted(sql, user_id) == (0, 1000)  # before: (1, 600), a charge the client was told failed
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "10.00"


@pytest.mark.single_redis
def test_a_late_event_after_a_real_redis_kill_and_empty_restart_is_not_persisted(
    api, redis_client, redis_server, sql, arrived_unacknowledged
):
    """The same with the run's private Redis SIGKILLed and restarted empty (no persistence: a failover that lost
    every write), the writer's claim then meeting a Redis that never heard of the entry."""
    user_id = funded(api, redis_client)
    _, taken = arrived_unacknowledged()
    publish_failed(api, user_id)
    redis_server.kill()
    redis_server.start()
    assert redis_client.dbsize() == 0
    deliver(taken)
    assert persisted(sql, user_id) == (0, 1000)  # before: (1, 600)
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "10.00"


def test_a_replay_after_the_tombstone_expired_is_not_persisted(api, redis_client, sql, arrived_unacknowledged):
    user_id = funded(api, redis_client)
    _, taken = arrived_unacknowledged()
    publish_failed(api, user_id)
    fate = keys.fate(user_id, taken[0]["id"])
    assert redis_client.get(fate) == b"rolledback"
    redis_client.delete(fate)  # entry_ttl_s (7 days) passed; the trigger replays the topic from TRIM_HORIZON
    deliver(taken)
    deliver(taken)
    assert persisted(sql, user_id) == (0, 1000)  # before: (1, 600)
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "10.00"


def test_a_charge_the_writer_persisted_first_stands_though_redis_lost_its_claim(
    api, redis_client, sql, arrived_unacknowledged
):
    """The writer won the race (persisted before the API's rollback), then Redis lost the fate key it claimed:
    the DB still knows the winner, so the API answers the charge, not PUBLISH_FAILED."""
    user_id = funded(api, redis_client)
    publish, _ = arrived_unacknowledged()

    def persisted_then_redis_lost_the_claim(event):
        deliver([event])
        redis_client.delete(keys.fate(user_id, event["id"]))

    publish.then = persisted_then_redis_lost_the_claim
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    assert status == 200 and body["balance"] == "6.00", body  # before: 503 PUBLISH_FAILED with the charge in the DB
    assert persisted(sql, user_id) == (1, 600)
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "6.00"


@pytest.fixture
def redis_cannot_give_back(monkeypatch):
    """The broker is down and, once the DB recorded the rollback, Redis cannot run the give-back: the API
    answers OUTCOME_UNKNOWN with the charge still pending in Redis."""
    from hotledger.dal.redis_store import RedisUnavailable
    from hotledger.ledger.feature import ledger

    def broker_down(key, value):
        raise NotAcknowledged("no acknowledgement in time")

    def unreachable(*args):
        raise RedisUnavailable("connection refused")

    def start():
        monkeypatch.setattr(ledger().durability, "publish", broker_down)
        monkeypatch.setattr(ledger().store, "rollback", unreachable)

    return start


def test_a_charge_the_db_rolled_back_that_redis_kept_is_given_back_by_the_reconciler(
    api, redis_client, sql, monkeypatch, redis_cannot_give_back
):
    from helpers import reconcile_pass

    user_id = funded(api, redis_client)
    redis_cannot_give_back()
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    assert status == 503 and body["error"]["code"] == "OUTCOME_UNKNOWN", body
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "6.00"  # still pending in Redis
    monkeypatch.undo()
    reconcile_pass(monkeypatch, age_s=0)  # the stale pending entry goes through the persister: the DB says rolled back
    assert persisted(sql, user_id) == (0, 1000)
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "10.00"
    assert redis_client.zcard(keys.pending(user_id)) == 0


def test_a_key_retry_after_the_db_rolled_back_its_charge_charges_once(
    api, redis_client, sql, monkeypatch, redis_cannot_give_back
):
    """The retry of an OUTCOME_UNKNOWN whose charge the DB rolled back must not replay it as a success (it will
    never be persisted): it is given back, and the retry charges afresh, once."""
    from hotledger.ledger.feature import ledger_store

    user_id = funded(api, redis_client)
    headers = {"Idempotency-Key": "unknown-then-retry"}
    redis_cannot_give_back()
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"}, headers)
    assert status == 503 and body["error"]["code"] == "OUTCOME_UNKNOWN", body
    monkeypatch.undo()
    monkeypatch.setattr(ledger_store(), "idempotency_stale_ms", 0)  # the first request is known dead
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"}, headers)
    assert status == 200 and body["balance"] == "6.00", body
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"}, headers) == (200, body)
    assert invoke_writer(ledger_records(redis_client, [user_id], first_offset=800)) == {"batchItemFailures": []}
    assert persisted(sql, user_id) == (1, 600)
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "6.00"


# vouchers: the same rule, the voucher row the lock -------------------------------------------------------------
@pytest.fixture
def order_arrived_unacknowledged(monkeypatch):
    """As arrived_unacknowledged, for voucher orders."""
    from hotledger.vouchers.feature import vouchers

    return _unacknowledged(monkeypatch, vouchers)


def new_voucher(api, stock: int = 5) -> int:
    import time

    now = int(time.time() * 1000)
    status, body = api(
        "POST", "/vouchers", {"title": "10 off", "stock": stock, "begin_at": now - 1000, "end_at": now + 3_600_000}
    )
    assert status == 201, body
    return int(body["voucher_id"])


def deliver_orders(events: list[dict]) -> None:
    from hotledger.outbox.events import VoucherOrderEvent

    parsed = [VoucherOrderEvent.model_validate(e) for e in events]
    assert invoke_writer(records(parsed, lambda e: f"v{e.voucher_id}", first_offset=900)) == {"batchItemFailures": []}


def sold(sql, voucher_id: int) -> tuple:
    return sql(
        "SELECT (SELECT COUNT(*) FROM t_voucher_order WHERE voucher_id = %s),"
        " (SELECT stock FROM t_seckill_voucher WHERE id = %s)",
        (voucher_id, voucher_id),
    )[0]


def order_publish_failed(api, voucher_id: int, user_id: int = 42) -> None:
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": user_id})
    assert status == 503 and body["error"]["code"] == "PUBLISH_FAILED", body


def test_a_late_voucher_order_after_redis_lost_the_voucher_is_not_persisted(
    api, redis_client, sql, order_arrived_unacknowledged
):
    voucher_id = new_voucher(api)
    _, taken = order_arrived_unacknowledged()
    order_publish_failed(api, voucher_id)
    lost = list(redis_client.scan_iter(match=f"voucher:*{keys.tag(f'v{voucher_id}')}*", count=1000))
    assert keys.voucher_fate(voucher_id, taken[0]["id"]).encode() in lost
    redis_client.delete(*lost)
    deliver_orders(taken)
    assert sold(sql, voucher_id) == (0, 5)  # before: (1, 4), a unit sold to a buyer told it failed


def test_a_voucher_order_replayed_after_its_tombstone_expired_is_not_persisted(
    api, redis_client, sql, order_arrived_unacknowledged
):
    voucher_id = new_voucher(api)
    _, taken = order_arrived_unacknowledged()
    order_publish_failed(api, voucher_id)
    fate = keys.voucher_fate(voucher_id, taken[0]["id"])
    assert redis_client.get(fate) == b"rolledback"
    redis_client.delete(fate)
    deliver_orders(taken)
    assert sold(sql, voucher_id) == (0, 5)  # before: (1, 4)
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 5


def test_a_voucher_order_the_writer_persisted_first_stands_though_redis_lost_its_claim(
    api, redis_client, sql, order_arrived_unacknowledged
):
    voucher_id = new_voucher(api)
    publish, _ = order_arrived_unacknowledged()

    def persisted_then_redis_lost_the_claim(event):
        deliver_orders([event])
        redis_client.delete(keys.voucher_fate(voucher_id, event["id"]))

    publish.then = persisted_then_redis_lost_the_claim
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 42})
    assert status == 200, body  # before: 503 PUBLISH_FAILED with the order in the DB
    assert sold(sql, voucher_id) == (1, 4)
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 4


# red packet grabs: the same rule, the item row the lock ---------------------------------------------------------
@pytest.fixture
def grab_arrived_unacknowledged(monkeypatch):
    """As arrived_unacknowledged, for red packet claims."""
    from hotledger.redpackets.feature import redpackets

    return _unacknowledged(monkeypatch, redpackets)


def new_packet(api) -> tuple[int, int]:
    """(a red packet of 1.00 in one item, a grabber)."""
    sender, grabber = api.account(balance="10.00"), api.account()
    status, body = api("POST", "/redpackets", {"sender_id": sender, "total": "1.00", "count": 1, "expires_in_s": 3600})
    assert status == 201, body
    return int(body["packet_id"]), grabber


def deliver_claims(events: list[dict]) -> None:
    from hotledger.outbox.events import RedPacketClaimEvent

    parsed = [RedPacketClaimEvent.model_validate(e) for e in events]
    assert invoke_writer(records(parsed, lambda e: f"rp{e.packet_id}", partition=1, first_offset=900)) == {
        "batchItemFailures": []
    }


def stamped(sql, packet_id: int) -> list:
    return [row[0] for row in sql("SELECT user_id FROM t_red_packet_item WHERE packet_id = %s", (packet_id,))]


def grab_publish_failed(api, packet_id: int, grabber: int) -> None:
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert status == 503 and body["error"]["code"] == "PUBLISH_FAILED", body


def test_a_late_claim_after_redis_lost_the_packet_is_not_stamped(api, redis_client, sql, grab_arrived_unacknowledged):
    packet_id, grabber = new_packet(api)
    _, taken = grab_arrived_unacknowledged()
    grab_publish_failed(api, packet_id, grabber)
    lost = list(redis_client.scan_iter(match=f"rp:*{keys.tag(f'rp{packet_id}')}*", count=1000))
    assert keys.packet_fate(packet_id, taken[0]["grab_id"]).encode() in lost
    redis_client.delete(*lost)
    deliver_claims(taken)
    assert stamped(sql, packet_id) == [None]  # before: [grabber], an item paid to a grabber told it failed


def test_a_claim_replayed_after_its_tombstone_expired_is_not_stamped(
    api, redis_client, sql, grab_arrived_unacknowledged
):
    packet_id, grabber = new_packet(api)
    _, taken = grab_arrived_unacknowledged()
    grab_publish_failed(api, packet_id, grabber)
    fate = keys.packet_fate(packet_id, taken[0]["grab_id"])
    assert redis_client.get(fate) == b"rolledback"
    redis_client.delete(fate)
    deliver_claims(taken)
    assert stamped(sql, packet_id) == [None]  # before: [grabber]


def test_a_claim_the_writer_stamped_first_stands_though_redis_lost_its_claim(
    api, redis_client, sql, grab_arrived_unacknowledged
):
    packet_id, grabber = new_packet(api)
    publish, _ = grab_arrived_unacknowledged()

    def stamped_then_redis_lost_the_claim(event):
        deliver_claims([event])
        redis_client.delete(keys.packet_fate(packet_id, event["grab_id"]))

    publish.then = stamped_then_redis_lost_the_claim
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
    assert status == 200 and body["amount"] == "1.00", body  # before: 503 PUBLISH_FAILED with the item stamped
    assert stamped(sql, packet_id) == [grabber]
    assert api("GET", f"/accounts/{grabber}")[1]["balance"] == "1.00"
