"""Flash-sale vouchers through the API handler (API Gateway events), the writer (MSK events) and the
reconciler (EventBridge events), against real Redis, MariaDB and the broker."""

import time

import pytest

from helpers import broker_records, invoke_writer, lift_rebuild_hold, reconcile, reconcile_pass, records, voucher
from hotledger import keys
from hotledger.vouchers.feature import vouchers

NOW_MS = int(time.time() * 1000)


def order_records(voucher_id: int, first_offset: int = 0):
    """The order events as the broker holds them, rebuilt from Redis's pending orders."""
    orders = sorted(vouchers().pending_orders(voucher_id), key=lambda e: e.id)
    return records(orders, lambda e: f"v{e.voucher_id}", first_offset=first_offset)


def test_order_is_taken_in_redis_persisted_once_and_replays_change_nothing(api, sql):
    voucher_id = voucher(api, stock=5)
    status, body = api("GET", f"/vouchers/{voucher_id}")
    assert status == 200 and (body["stock_left"], body["sold"], body["pending"]) == (5, 0, 0)
    status, order = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 42})
    assert status == 200 and order["seq"] == 1 and order["user_id"] == 42
    assert api("GET", f"/vouchers/{voucher_id}/orders/{order['order_id']}")[1]["status"] == "PENDING"
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 4

    records = order_records(voucher_id)
    invoke_writer(records)
    invoke_writer(records + records)  # re-delivery changes nothing
    assert api("GET", f"/vouchers/{voucher_id}/orders/{order['order_id']}")[1]["status"] == "PERSISTED"
    assert sql("SELECT id, user_id, seq FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,)) == (
        (int(order["order_id"]), 42, 1),
    )
    assert sql("SELECT stock FROM t_seckill_voucher WHERE id = %s", (voucher_id,)) == ((4,),)
    view = api("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["stock_left"], view["sold"], view["pending"]) == (4, 1, 0)


def test_sale_rules_answer_409_with_their_codes_and_take_nothing(api):
    early = voucher(api, begin_at=NOW_MS + 3_600_000, end_at=NOW_MS + 7_200_000)
    late = voucher(api, begin_at=NOW_MS - 7_200_000, end_at=NOW_MS - 3_600_000)
    one = voucher(api, stock=1)
    twice = voucher(api, stock=10, per_user_limit=2)
    assert api("POST", f"/vouchers/{early}/orders", {"user_id": 1})[1]["error"]["code"] == "SALE_NOT_STARTED"
    assert api("POST", f"/vouchers/{late}/orders", {"user_id": 1})[1]["error"]["code"] == "SALE_ENDED"
    assert api("POST", f"/vouchers/{one}/orders", {"user_id": 1})[0] == 200
    status, body = api("POST", f"/vouchers/{one}/orders", {"user_id": 2})
    assert (status, body["error"]["code"]) == (409, "SOLD_OUT")
    assert [api("POST", f"/vouchers/{twice}/orders", {"user_id": 7})[1].get("seq") for _ in range(2)] == [1, 2]
    status, body = api("POST", f"/vouchers/{twice}/orders", {"user_id": 7})
    assert (status, body["error"]["code"]) == (409, "ALREADY_ORDERED")
    assert api("GET", f"/vouchers/{twice}")[1]["stock_left"] == 8
    assert api("GET", f"/vouchers/{early}")[1]["stock_left"] == 5


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"title": "x", "stock": 0, "begin_at": 0, "end_at": 1}, 422, "VALIDATION_ERROR"),
        ({"title": "x", "stock": 5, "begin_at": 10, "end_at": 5}, 422, "VALIDATION_ERROR"),
        ({"title": "x", "stock": "5", "begin_at": 0, "end_at": 1}, 422, "VALIDATION_ERROR"),
        ({"stock": 5, "begin_at": 0, "end_at": 1}, 422, "MISSING_FIELD"),
    ],
)
def test_bad_voucher_input_is_refused(api, sql, body, status, code):
    before = sql("SELECT COUNT(*) FROM t_seckill_voucher")
    answer = api("POST", "/vouchers", body)
    assert (answer[0], answer[1]["error"]["code"]) == (status, code)
    assert sql("SELECT COUNT(*) FROM t_seckill_voucher") == before


def test_unknown_voucher_order_and_malformed_json(api):
    voucher_id = voucher(api)
    assert api("POST", "/vouchers/999999999/orders", {"user_id": 1})[1]["error"]["code"] == "VOUCHER_NOT_FOUND"
    assert api("GET", "/vouchers/999999999")[0] == 404
    assert api("GET", f"/vouchers/{voucher_id}/orders/12345")[1]["error"]["code"] == "ORDER_NOT_FOUND"
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", raw='{"user_id": ')
    assert (status, body["error"]["code"]) == (400, "MALFORMED_JSON")
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 0})
    assert (status, body["error"]["code"]) == (422, "VALIDATION_ERROR")
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 5


def test_a_failed_publish_gives_the_unit_back(api, monkeypatch):
    from hotledger.dal.publisher import NotAcknowledged

    voucher_id = voucher(api, stock=1)

    def broker_down(key, value):
        raise NotAcknowledged("no acknowledgement in time")

    monkeypatch.setattr(vouchers().durability, "publish", broker_down)
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 5})
    assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED")
    monkeypatch.undo()
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 1
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 5})[0] == 200  # not counted as bought


def test_reconciler_persists_lost_events_and_rebuilds_a_voucher_redis_lost(api, sql, redis_client, monkeypatch):
    voucher_id = voucher(api, stock=10)
    for user in (1, 2, 3):
        assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": user})[0] == 200
    in_flight = order_records(voucher_id)[2:]  # orders 1 and 2 persisted by the writer, 3 still on the broker
    invoke_writer(order_records(voucher_id)[:2])
    # Redis loses everything about the voucher; order 3 reaches the DB only after the rebuild
    redis_client.delete(keys.voucher(voucher_id), keys.voucher_buyers(voucher_id), keys.voucher_pending(voucher_id))
    assert sum(report["vouchers"]["rebuilt"] for report in reconcile_pass()) >= 1
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 9})
    assert (status, body["error"]["code"]) == (503, "RECOVERING")  # in-flight orders land first
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 8
    invoke_writer(in_flight)
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 7  # counted late, exactly once
    invoke_writer(in_flight)
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 7
    lift_rebuild_hold(redis_client, keys.voucher(voucher_id))
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 3})[1]["error"]["code"] == "ALREADY_ORDERED"
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 4})[0] == 200

    # the event of user 4's order is lost: after RECONCILE_AGE_S the reconciler persists it from Redis
    reconcile_pass(monkeypatch, age_s=0)
    assert sql("SELECT COUNT(*), SUM(user_id = 4) FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,)) == (
        (4, 1),
    )
    view = api("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["stock_left"], view["sold"], view["pending"]) == (6, 4, 0)


def test_an_ended_sale_leaves_redis_once_nothing_is_pending(api, redis_client):
    now = int(time.time() * 1000)
    live, ended = voucher(api), voucher(api, begin_at=now - 60_000, end_at=now + 1500)
    assert api("POST", f"/vouchers/{ended}/orders", {"user_id": 1})[0] == 200
    in_flight = order_records(ended)
    time.sleep(max(0.0, (now + 1600 - time.time() * 1000) / 1000))
    reconcile_pass()
    assert redis_client.ttl(keys.voucher(ended)) == -1  # an order is still on its way to the DB
    invoke_writer(in_flight)
    reconcile_pass()
    assert 0 < redis_client.ttl(keys.voucher(ended)) <= 86_400 and redis_client.ttl(keys.voucher_buyers(ended)) > 0
    assert redis_client.ttl(keys.voucher(live)) == -1
    redis_client.delete(keys.voucher(ended), keys.voucher_buyers(ended))  # the TTL ran out
    assert api("POST", f"/vouchers/{ended}/orders", {"user_id": 2})[1]["error"]["code"] == "SALE_ENDED"
    assert 0 < redis_client.ttl(keys.voucher(ended)) <= 86_400  # reloaded for the late request, and retired again
    assert api("GET", f"/vouchers/{ended}")[1]["sold"] == 1


def test_reconciler_corrects_redis_stock_that_drifted(api, redis_client):
    voucher_id = voucher(api, stock=10)
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 1})[0] == 200
    redis_client.hset(keys.voucher(voucher_id), "stock", 3)
    assert sum(report["vouchers"]["corrected"] for report in reconcile_pass()) >= 1
    assert api("GET", f"/vouchers/{voucher_id}")[1]["stock_left"] == 9  # 10 - 1 pending, nothing sold in the DB yet


def test_a_voucher_the_reconciler_meets_while_it_is_created_sells_at_once(api, monkeypatch):
    """The scheduled reconciler (another process) runs right after the create's DB insert. It must not take the new
    voucher for one Redis lost and rebuild it with a hold: the first buyer would get 503 RECOVERING for
    REBUILD_HOLD_S (found by the fuzzer)."""
    import threading

    db = vouchers().db
    create, reports = db.create, []

    def reconciler_runs_right_after_the_insert(*args, **kwargs):
        voucher_id = create(*args, **kwargs)
        run = threading.Thread(
            target=lambda: reports.append(reconcile())
        )  # its own DB connection, as in another process
        run.start()
        run.join(30)
        return voucher_id

    monkeypatch.setattr(db, "create", reconciler_runs_right_after_the_insert)
    voucher_id = voucher(api, stock=2)
    monkeypatch.undo()
    assert len(reports) == 1 and "vouchers" not in reports[0]["failed_parts"], reports
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 7})
    assert status == 200, body


def assert_settled_as_refused(api, redis_client, voucher_id: int, buyer: int, stock_left: int, sold: int) -> None:
    """The buyer's refused order left Redis as the DB never took it (nothing pending, the unit and the buyer's slot
    given back: Redis == DB), the reconciler finds nothing to change, and the buyer may order again."""
    assert redis_client.hlen(keys.voucher_pending(voucher_id)) == 0
    assert redis_client.hget(keys.voucher_buyers(voucher_id), str(buyer)) is None
    view = api("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["stock_left"], view["pending"], view["sold"]) == (stock_left, 0, sold), view
    reconcile()
    assert api("GET", f"/vouchers/{voucher_id}")[1] == view
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": buyer})[0] == 200  # the buyer's slot is free again


def test_an_order_the_db_refuses_is_dead_lettered_and_settled_in_redis_as_refused(api, sql, redis_client):
    """The DB gives the order's id to another order (a snowflake repeated across hosts whose clocks were apart): the
    writer dead-letters the order and gives its unit and the buyer's slot back in Redis, so Redis == DB and the
    reconciler finds nothing pending."""
    voucher_id = voucher(api, stock=3, per_user_limit=1)
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 11})
    assert status == 200, body
    other = voucher(api, stock=3)
    sql(
        "INSERT INTO t_voucher_order (id, voucher_id, user_id, seq, create_time) VALUES (%s, %s, 12, 1, NOW(3))",
        (int(body["order_id"]), other),
    )
    assert invoke_writer(order_records(voucher_id)) == {"batchItemFailures": []}
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE offset_no = %s", (int(body["order_id"]),)) == ((1,),)
    assert sql("SELECT stock FROM t_seckill_voucher WHERE id = %s", (voucher_id,)) == ((3,),)
    assert_settled_as_refused(api, redis_client, voucher_id, buyer=11, stock_left=3, sold=0)


def test_an_order_the_db_refuses_alone_in_the_writers_bisect_is_settled_in_redis_as_refused(api, sql, redis_client):
    """The DB refuses one order of a batch for its data (its seq is out of the column's range): the writer bisects the
    batch, persists the good order once and dead-letters the refused one. Before: the refused order stayed pending in
    Redis (unit and buyer's slot held), so Redis != DB and the reconciler met it on every run."""
    voucher_id = voucher(api, stock=3, per_user_limit=1)
    for buyer in (21, 22):
        assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": buyer})[0] == 200
    good, bad = sorted(vouchers().pending_orders(voucher_id), key=lambda e: e.user_id)
    refused = bad.model_copy(update={"seq": 2**40})
    batch = records([good, refused], lambda e: f"v{e.voucher_id}")
    for _ in range(2):  # the first delivery, then a re-delivery: it changes nothing
        assert invoke_writer(batch) == {"batchItemFailures": []}
        assert sql("SELECT id, user_id FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,)) == ((good.id, 21),)
        ((error,),) = sql("SELECT error FROM t_dead_letter WHERE offset_no = %s", (bad.id,))
        assert "Out of range" in error
        assert sql("SELECT stock FROM t_seckill_voucher WHERE id = %s", (voucher_id,)) == ((2,),)
    assert_settled_as_refused(api, redis_client, voucher_id, buyer=22, stock_left=2, sold=1)


def test_a_voucher_redis_lost_resells_nothing_before_the_orders_acknowledged_before_the_loss_are_in_the_db(
    api, sql, redis_client, own_topic
):
    """Redis loses a sold-out voucher while its three acknowledged orders are still on their way to the DB (the
    writer lags past REBUILD_HOLD_S); buyers hammer the rebuilt voucher. No unit is sold again, so no 200 is
    later refused by the DB, and the DB holds exactly the stock."""
    voucher_id = voucher(api, stock=3)
    acknowledged = [
        api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": user})[1]["order_id"] for user in (1, 2, 3)
    ]
    redis_client.flushall()
    answers = []
    for round_ in range(4):  # REBUILD_HOLD_S over each round; the writer still lags
        answers += [api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 100 + round_ * 10 + b}) for b in range(5)]
        lift_rebuild_hold(redis_client, keys.voucher(voucher_id), log_too=False)
    assert {(status, body["error"]["code"]) for status, body in answers} == {(503, "RECOVERING")}
    invoke_writer(broker_records())  # the writer catches up
    lift_rebuild_hold(redis_client, keys.voucher(voucher_id), log_too=False)
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 200})
    assert (status, body["error"]["code"]) == (409, "SOLD_OUT"), body
    invoke_writer(broker_records())
    assert sorted(
        str(i) for (i,) in sql("SELECT id FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,))
    ) == sorted(acknowledged)
    assert sql("SELECT stock FROM t_seckill_voucher WHERE id = %s", (voucher_id,)) == ((0,),)
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE record_key = %s", (f"v{voucher_id}",)) == ((0,),)
