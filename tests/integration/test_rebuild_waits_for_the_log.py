"""What waits for the log after a Redis loss (issue 35, class 3): a voucher sale and an expired red packet rebuilt
while changes acknowledged before the loss are still in the log, on their way to the writer, wait for the writer's
log hold (outbox/log_hold.py) and not only for the time hold: past REBUILD_HOLD_S, with the writer lagging, the
sale answers RECOVERING and sells nothing, the expiry refunds nothing; once the writer applied the log as it was,
the sale sells what is left and the packet refunds its unclaimed rest. (A red packet's grabs are held so too:
tests/integration/test_redpackets.py.) Through the API handler, the packets' expiry handler and the writer, against
real Redis, MariaDB and a topic of the test's own."""

from __future__ import annotations

import itertools
import time

from helpers import broker_records, invoke_writer, lift_rebuild_hold, voucher
from hotledger import keys

_buyers = itertools.count(7_100_000)


def _order(api, voucher_id: int, user_id: int):
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": user_id})
    return (status, body["error"]["code"] if status != 200 else None), body


def test_a_voucher_redis_lost_sells_nothing_until_the_orders_acknowledged_before_the_loss_are_in_the_db(
    api, sql, redis_client, own_topic
):
    voucher_id = voucher(api, stock=2)
    first, second, third = next(_buyers), next(_buyers), next(_buyers)
    assert _order(api, voucher_id, first)[0] == (200, None)  # acknowledged; its event is still in the log
    redis_client.flushall()
    assert _order(api, voucher_id, second)[0] == (503, "RECOVERING")  # rebuilt from the DB: 2 left there
    for _ in range(3):  # REBUILD_HOLD_S is over, the writer still lags: the log hold stays
        lift_rebuild_hold(redis_client, keys.voucher(voucher_id), log_too=False)
        assert _order(api, voucher_id, second)[0] == (503, "RECOVERING")
    assert redis_client.hget(keys.voucher(voucher_id), "stock") == b"2"  # nothing sold from the rebuilt stock
    assert invoke_writer(broker_records()) == {"batchItemFailures": []}  # the first order lands, counted late
    lift_rebuild_hold(redis_client, keys.voucher(voucher_id), log_too=False)
    assert _order(api, voucher_id, second)[0] == (200, None)
    assert _order(api, voucher_id, third)[0] == (409, "SOLD_OUT")
    assert invoke_writer(broker_records()) == {"batchItemFailures": []}
    assert sorted(u for (u,) in sql("SELECT user_id FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,))) == [
        first,
        second,
    ]
    assert sql("SELECT stock FROM t_seckill_voucher WHERE id = %s", (voucher_id,)) == ((0,),)
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE record_key LIKE %s", (f"v{voucher_id}%",)) == ((0,),)


def test_an_expired_packet_redis_lost_refunds_nothing_until_the_claims_acknowledged_before_the_loss_are_in_the_db(
    api, sql, redis_client, own_topic
):
    from hotledger.redpackets.feature import redpackets
    from hotledger.redpackets.service import Expiry

    sender, first = api.account(balance="10.00"), api.account()
    status, body = api("POST", "/redpackets", {"sender_id": sender, "total": "2.00", "count": 2, "expires_in_s": 1})
    assert status == 201, body
    packet_id = int(body["packet_id"])
    assert invoke_writer(broker_records()) == {"batchItemFailures": []}  # the debit is in the DB; now the writer lags
    status, grab = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": first})
    assert status == 200, grab  # acknowledged; its claim is still in the log
    redis_client.flushall()
    time.sleep(1.1)  # expired
    packets = redpackets()
    assert packets.expire(packet_id, packets.clock()) is Expiry.REBUILT  # from the DB: no claim there yet
    for _ in range(3):  # REBUILD_HOLD_S is over, the writer still lags: no refund of the claimed item
        lift_rebuild_hold(redis_client, keys.packet(packet_id), log_too=False)
        assert packets.expire(packet_id, packets.clock()) is Expiry.NOT_YET
    assert sql("SELECT state, refund FROM t_red_packet WHERE id = %s", (packet_id,)) == (("OPEN", None),)
    assert invoke_writer(broker_records()) == {"batchItemFailures": []}  # the claim lands
    lift_rebuild_hold(redis_client, keys.packet(packet_id), log_too=False)
    assert packets.expire(packet_id, packets.clock()) in (Expiry.REFUNDED, Expiry.REFUND_FAILED)
    claimed = int(round(float(grab["amount"]) * 100))
    ((state, refund),) = sql("SELECT state, refund FROM t_red_packet WHERE id = %s", (packet_id,))
    assert state in ("REFUNDING", "REFUNDED") and refund == 200 - claimed  # the rest only, never the claimed item


def test_a_log_hold_checked_while_a_second_loss_rebuilt_the_voucher_again_is_not_lifted(
    api, redis_client, own_topic, monkeypatch
):
    """The caller that finds the writer caught up lifts the hold by compare-and-set (outbox_hold_swap): a second
    loss and rebuild between its read of the hold and its lift started a hold of its own, for changes of its own
    still in the log, which that lift must leave in place (the sale stays RECOVERING)."""
    from hotledger.vouchers.feature import vouchers

    voucher_id = voucher(api, stock=2)
    assert _order(api, voucher_id, next(_buyers))[0] == (200, None)
    redis_client.flushall()
    assert _order(api, voucher_id, next(_buyers))[0] == (503, "RECOVERING")  # rebuilt, held
    assert invoke_writer(broker_records()) == {"batchItemFailures": []}  # the writer caught up with that log
    lift_rebuild_hold(redis_client, keys.voucher(voucher_id), log_too=False)
    hold = vouchers().hold
    applied = hold.outbox.applied_offsets

    def lost_again_meanwhile(topic):
        # the caller read the hold; Redis is lost and the voucher rebuilt once more before it lifts it
        redis_client.hset(keys.voucher(voucher_id), mapping={"hold_log": "await", "hold_until": 0})
        return applied(topic)

    monkeypatch.setattr(hold.outbox, "applied_offsets", lost_again_meanwhile)
    buyer = next(_buyers)
    assert _order(api, voucher_id, buyer)[0] == (503, "RECOVERING")
    assert redis_client.hget(keys.voucher(voucher_id), "hold_log") == b"await"  # the second rebuild's hold stands
    monkeypatch.setattr(hold.outbox, "applied_offsets", applied)
    lift_rebuild_hold(redis_client, keys.voucher(voucher_id), log_too=False)
    assert _order(api, voucher_id, buyer)[0] == (200, None)  # its own check finds the log applied, and lifts it


def test_a_bucket_redis_lost_sells_nothing_to_another_homes_buyer_until_its_orders_are_in_the_db(
    api, sql, redis_client, own_topic
):
    """Two buckets of one unit each. A buyer homed at bucket 1 takes its unit; Redis loses bucket 1 while that order
    is still in the log. Bucket 0 sells its unit, and its next buyer falls over to bucket 1, rebuilt from the DB
    (one unit there): past REBUILD_HOLD_S, with the writer lagging, that take waits (voucher_take's held) and
    sells nothing; once the writer applied the log, bucket 1 is empty and the sale is sold out."""
    from hotledger.vouchers.rows import home_bucket

    voucher_id = voucher(api, stock=2, stock_shards=2)
    homed = {h: [u for u in range(7_200_000, 7_200_400) if home_bucket(u, 2) == h][:2] for h in (0, 1)}
    assert _order(api, voucher_id, homed[1][0])[0] == (200, None)  # bucket 1's unit; its event still in the log
    for key in (keys.voucher, keys.voucher_buyers, keys.voucher_pending, keys.voucher_away):
        redis_client.delete(key(voucher_id, 1))  # Redis lost bucket 1
    assert _order(api, voucher_id, homed[0][0])[0] == (200, None)  # bucket 0's unit
    buyer = homed[0][1]
    assert _order(api, voucher_id, buyer)[0] == (503, "RECOVERING")  # bucket 1 rebuilt (1 unit in the DB), held
    for _ in range(3):  # REBUILD_HOLD_S is over, the writer still lags: the log hold stays
        lift_rebuild_hold(redis_client, keys.voucher(voucher_id, 1), log_too=False)
        assert _order(api, voucher_id, buyer)[0] == (503, "RECOVERING")
    assert redis_client.hget(keys.voucher(voucher_id, 1), "stock") == b"1"  # nothing taken from it
    assert invoke_writer(broker_records()) == {"batchItemFailures": []}  # bucket 1's order lands, counted late
    lift_rebuild_hold(redis_client, keys.voucher(voucher_id, 1), log_too=False)
    assert _order(api, voucher_id, buyer)[0] == (409, "SOLD_OUT")
    assert invoke_writer(broker_records()) == {"batchItemFailures": []}
    assert sorted(
        u for (u,) in sql("SELECT user_id FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,))
    ) == sorted([homed[1][0], homed[0][0]])
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE record_key LIKE %s", (f"v{voucher_id}%",)) == ((0,),)
