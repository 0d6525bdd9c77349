"""A voucher sold from stock buckets (stock_shards, issue 12) through the API handler, the writer (MSK events from
the broker's own log) and the reconciler, against real Redis, MariaDB and the broker: fall-over to other buckets,
one buyer record per user across buckets, sold out in one script call, per-bucket persist, rebuild and reconcile."""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter

import pytest

from helpers import broker_records, invoke_writer, lift_rebuild_hold, reconcile, reconcile_totals, voucher
from hotledger import keys
from hotledger.vouchers.feature import vouchers
from hotledger.vouchers.rows import home_bucket

SHARDS = 4
_users = itertools.count(5_000_000)


def buyers_homed_at(home: int, n: int) -> list[int]:
    """n new user ids whose home bucket is `home`."""
    return list(itertools.islice((u for u in _users if home_bucket(u, SHARDS) == home), n))


def order(api, voucher_id: int, user_id: int):
    status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": user_id})
    return status if status == 200 else body["error"]["code"], body


@contextlib.contextmanager
def scripts_run():
    """Yields the names of the voucher scripts the service runs meanwhile (each still runs on Redis)."""
    lua = vouchers().redis.lua
    names, run = [], lua.run

    def counted(name, *args, **kwargs):
        names.append(name)
        return run(name, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lua, "run", counted)
        yield names


def bucket_rows(sql, voucher_id: int) -> list[int]:
    return [
        stock
        for (stock,) in sql("SELECT stock FROM t_voucher_bucket WHERE voucher_id = %s ORDER BY bucket", (voucher_id,))
    ]


def test_buyers_fall_over_to_the_next_buckets_and_the_sale_is_sold_out_when_every_bucket_is(
    api, sql, redis_client, own_topic
):
    voucher_id = voucher(api, stock=8, stock_shards=SHARDS)
    view = api("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["stock_shards"], view["bucket_stock_left"], view["stock_left"]) == (4, [2, 2, 2, 2], 8)
    at_home_0 = buyers_homed_at(0, 9)
    answers = [order(api, voucher_id, u) for u in at_home_0]
    assert [code for code, _ in answers] == [200] * 8 + ["SOLD_OUT"]
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [0, 0, 0, 0]  # every bucket drained

    # a buyer of another home probes the buckets once, then its home knows them empty: one script per request
    at_home_1 = buyers_homed_at(1, 2)
    with scripts_run() as calls:
        assert order(api, voucher_id, at_home_1[0])[0] == "SOLD_OUT"
    assert Counter(calls) == {"voucher_order": 1, "voucher_take": 3, "voucher_release": 1}
    with scripts_run() as calls:
        assert order(api, voucher_id, at_home_1[1])[0] == "SOLD_OUT"
    assert calls == ["voucher_order"]

    invoke_writer(broker_records())
    rows = sql("SELECT id, user_id, seq, bucket FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,))
    assert sorted((str(i), u) for i, u, _, _ in rows) == sorted((b["order_id"], b["user_id"]) for _, b in answers[:8])
    assert Counter(bucket for *_, bucket in rows) == {0: 2, 1: 2, 2: 2, 3: 2} and {seq for _, _, seq, _ in rows} == {1}
    assert bucket_rows(sql, voucher_id) == [0, 0, 0, 0]
    assert sql("SELECT stock FROM t_seckill_voucher WHERE id = %s", (voucher_id,)) == ((0,),)
    assert redis_client.hlen(keys.voucher_away(voucher_id, 0)) == 0  # every away reservation settled at home
    assert all(redis_client.hget(keys.voucher_buyers(voucher_id, 0), str(u)) == b"1" for u in at_home_0[:8])
    reconcile()
    view = api("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["stock_left"], view["sold"], view["pending"], view["bucket_stock_left"]) == (0, 8, 0, [0, 0, 0, 0])


def test_a_buyer_allowed_three_orders_gets_them_across_buckets_and_no_fourth(api, sql, redis_client, own_topic):
    voucher_id = voucher(api, stock=8, stock_shards=SHARDS, per_user_limit=3)
    (buyer,) = buyers_homed_at(2, 1)
    answers = [order(api, voucher_id, buyer) for _ in range(4)]
    assert [(code, body.get("seq")) for code, body in answers] == [
        (200, 1),
        (200, 2),
        (200, 3),
        ("ALREADY_ORDERED", None),
    ]
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [2, 2, 0, 1]  # the third from bucket 3
    invoke_writer(broker_records())
    assert sql("SELECT seq, bucket FROM t_voucher_order WHERE voucher_id = %s ORDER BY seq", (voucher_id,)) == (
        (1, 2),
        (2, 2),
        (3, 3),
    )
    assert bucket_rows(sql, voucher_id) == [2, 2, 0, 1]
    assert redis_client.hget(keys.voucher_buyers(voucher_id, 2), str(buyer)) == b"3"
    assert redis_client.hlen(keys.voucher_away(voucher_id, 2)) == 0
    assert order(api, voucher_id, buyer)[0] == "ALREADY_ORDERED"


def test_buckets_redis_lost_mid_sale_are_rebuilt_and_resell_nothing_acknowledged_before_the_loss(
    api, sql, redis_client, own_topic
):
    voucher_id = voucher(api, stock=12, stock_shards=SHARDS)  # 3 a bucket
    before = buyers_homed_at(0, 4) + buyers_homed_at(2, 2)  # the fourth of home 0 falls over to bucket 1
    acknowledged = {order(api, voucher_id, u)[1]["order_id"] for u in before}
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [0, 2, 1, 3]
    redis_client.flushall()  # every order still on its way to the DB
    during = [order(api, voucher_id, u)[0] for u in buyers_homed_at(1, 2) + buyers_homed_at(3, 2)]
    assert set(during) == {"RECOVERING"}
    invoke_writer(broker_records())  # the writer catches up: orders taken before the loss counted into the rebuild
    for bucket in range(SHARDS):
        lift_rebuild_hold(redis_client, keys.voucher(voucher_id, bucket))
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [0, 2, 1, 3]
    assert {order(api, voucher_id, u)[0] for u in before} == {"ALREADY_ORDERED"}  # the away buyer too
    after = buyers_homed_at(1, 3) + buyers_homed_at(3, 4)
    answers = [order(api, voucher_id, u) for u in after]
    assert Counter(code for code, _ in answers) == {200: 6, "SOLD_OUT": 1}
    invoke_writer(broker_records())
    rows = sql("SELECT id, user_id FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,))
    assert {str(i) for i, _ in rows} == acknowledged | {b["order_id"] for code, b in answers if code == 200}
    assert len({u for _, u in rows}) == 12
    assert bucket_rows(sql, voucher_id) == [0, 0, 0, 0]
    assert sql("SELECT stock FROM t_seckill_voucher WHERE id = %s", (voucher_id,)) == ((0,),)
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE record_key LIKE %s", (f"v{voucher_id}%",)) == ((0,),)


def test_the_reconciler_gives_back_a_buyer_slot_reserved_by_a_process_that_died_and_corrects_each_bucket(
    api, redis_client, monkeypatch
):
    voucher_id = voucher(api, stock=4, stock_shards=SHARDS)
    first, buyer = buyers_homed_at(0, 2)
    assert order(api, voucher_id, first)[0] == 200  # bucket 0 is empty now
    # a process reserves the buyer's slot at home and dies before it takes the unit elsewhere
    reply = vouchers().redis.order(voucher_id, buyer, 1, vouchers().clock(), home=0, shards=SHARDS)
    assert (reply.status.value, reply.seq, reply.probes) == ("away", 1, (1, 2, 3))
    assert order(api, voucher_id, buyer)[0] == "ALREADY_ORDERED"
    redis_client.hset(keys.voucher(voucher_id, 2), "stock", 7)  # bucket 2 drifted
    report = reconcile_totals(monkeypatch, age_s=0)["vouchers"]
    assert report["away_given_back"] == 1 and report["corrected"] >= 1
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [0, 1, 1, 1]
    code, body = order(api, voucher_id, buyer)
    assert (code, body["seq"]) == (200, 1)
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [0, 0, 1, 1]


def test_stock_shards_out_of_range_are_refused_with_nothing_created(api, sql):
    before = sql("SELECT COUNT(*) FROM t_seckill_voucher")
    for shards, stock in ((0, 10), (65, 100), (5, 4), ("4", 10)):
        status, body = api(
            "POST", "/vouchers", {"title": "x", "stock": stock, "begin_at": 0, "end_at": 2**41, "stock_shards": shards}
        )
        assert (status, body["error"]["code"]) == (422, "VALIDATION_ERROR"), (shards, body)
    assert sql("SELECT COUNT(*) FROM t_seckill_voucher") == before


def test_an_order_the_db_refuses_is_settled_in_its_own_bucket(api, sql, redis_client, own_topic):
    """Issue 19 item 5: a record the DB refuses for its data was settled with bucket 0's keys, so an order taken from
    another bucket stayed pending for good, its unit lost and its buyer answered ALREADY_ORDERED."""
    voucher_id = voucher(api, stock=8, stock_shards=SHARDS)
    (buyer,) = buyers_homed_at(2, 1)
    code, body = order(api, voucher_id, buyer)
    assert code == 200, body
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [2, 2, 1, 2]
    # the DB refuses this one row for its data (a CHECK the persister does not know of)
    sql(f"ALTER TABLE t_voucher_order ADD CONSTRAINT chk_refuse_{buyer} CHECK (user_id <> {buyer})")
    try:
        assert invoke_writer(broker_records()) == {"batchItemFailures": []}
    finally:
        sql(f"ALTER TABLE t_voucher_order DROP CONSTRAINT chk_refuse_{buyer}")
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE offset_no = %s", (int(body["order_id"]),)) == ((1,),)
    view = api("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["pending"], view["bucket_stock_left"]) == (0, [2, 2, 2, 2]), view  # settled: its unit given back
    assert redis_client.hlen(keys.voucher_pending(voucher_id, 2)) == 0
    assert order(api, voucher_id, buyer)[0] == 200  # the buyer's slot was given back with it


def test_a_failed_publish_gives_the_unit_back_to_its_own_bucket_and_the_buyer_slot(api, monkeypatch):
    """Multi-bucket vouchers go through every path single-bucket ones do (issue 19): a failed publish of an order
    taken from a bucket other than 0 gives its unit back there, and the buyer may order again."""
    from hotledger.dal.publisher import NotAcknowledged

    voucher_id = voucher(api, stock=8, stock_shards=SHARDS)
    (buyer,) = buyers_homed_at(3, 1)

    def broker_down(key, value):
        raise NotAcknowledged("no acknowledgement in time")

    monkeypatch.setattr(vouchers().durability, "publish", broker_down)
    code, body = order(api, voucher_id, buyer)
    assert code == "PUBLISH_FAILED", body
    monkeypatch.undo()
    view = api("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["bucket_stock_left"], view["pending"]) == ([2, 2, 2, 2], 0), view
    code, body = order(api, voucher_id, buyer)
    assert code == 200 and body["seq"] == 1, body  # not counted as bought
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [2, 2, 2, 1]


def test_a_bucket_lost_while_a_buyer_falls_over_to_it_is_rebuilt_held_and_then_sells(api, redis_client, own_topic):
    """voucher_take's missing, recovering and held replies, and voucher_release's gone: the home bucket is empty, the
    next bucket Redis lost is rebuilt and waits (the buyer takes the unit from the one after), then its hold is
    checked against the (empty) log and lifted, and it sells again."""
    voucher_id = voucher(api, stock=8, stock_shards=SHARDS)
    at_home_0 = buyers_homed_at(0, 4)
    assert [order(api, voucher_id, u)[0] for u in at_home_0[:2]] == [200, 200]  # bucket 0 is empty now
    redis_client.delete(keys.voucher(voucher_id, 1))  # Redis lost bucket 1
    with scripts_run() as names:
        code, body = order(api, voucher_id, at_home_0[2])  # bucket 1 missing: rebuilt, recovering; bucket 2 sells
    assert code == 200, body
    assert names.count("voucher_take") >= 3
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [0, 2, 1, 2]
    assert invoke_writer(broker_records()) == {"batchItemFailures": []}  # the writer applied the log
    redis_client.hset(keys.voucher(voucher_id, 1), "hold_until", 0)  # the time hold passed; the log hold remains
    code, body = order(api, voucher_id, at_home_0[3])  # held: the log is checked, the hold lifted, bucket 1 sells
    assert code == 200, body
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [0, 1, 1, 2]
    # the order stands: its away record goes (the writer's settle does this), and a second release finds it gone and
    # changes nothing in the buyer's slot (a resend, or the reconciler's after the request's own)
    release = lambda: vouchers().redis.release(voucher_id, 0, int(body["order_id"]), at_home_0[3], give_back=False)  # noqa: E731
    assert (release(), release()) == (True, False)
    assert order(api, voucher_id, at_home_0[3])[0] == "ALREADY_ORDERED"


# every bucket's stock and every slot, not only the total (issue 35, class 4) ----------------------------------------
def slots(redis_client, voucher_id: int, user_id: int, home: int) -> tuple:
    """The buyer's slot at home (orders counted), the away records of that home, each bucket's pending order ids."""
    return (
        int(redis_client.hget(keys.voucher_buyers(voucher_id, home), str(user_id)) or 0),
        sorted(int(o) for o in redis_client.hkeys(keys.voucher_away(voucher_id, home))),
        [sorted(int(o) for o in redis_client.hkeys(keys.voucher_pending(voucher_id, b))) for b in range(SHARDS)],
    )


def test_an_away_order_takes_its_unit_elsewhere_and_its_slot_at_home_and_a_rollback_gives_each_back_there(
    api, sql, redis_client, monkeypatch, own_topic
):
    """A buyer whose home bucket is empty: the unit comes from the next bucket, the slot is reserved at home (an away
    record) while the order is pending; a failed publish gives the unit back to the bucket it came from (not the
    home) and the slot back at home; the writer persists one in the unit's bucket and settles the away record."""
    from hotledger.dal.publisher import NotAcknowledged

    voucher_id = voucher(api, stock=8, stock_shards=SHARDS)
    first, second, buyer = buyers_homed_at(0, 3)
    assert [order(api, voucher_id, u)[0] for u in (first, second)] == [200, 200]
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [0, 2, 2, 2]

    def broker_down(key, value):
        raise NotAcknowledged("no acknowledgement in time")

    with monkeypatch.context() as down:
        down.setattr(vouchers().durability, "publish", broker_down)
        code, body = order(api, voucher_id, buyer)
        assert code == "PUBLISH_FAILED", body
    view = api("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["bucket_stock_left"], view["pending"]) == ([0, 2, 2, 2], 2), view  # the unit back in bucket 1
    assert slots(redis_client, voucher_id, buyer, 0)[:2] == (0, [])  # the slot back at home, no away record left

    code, body = order(api, voucher_id, buyer)  # again: away once more, pending until the writer persists it
    assert (code, body["seq"]) == (200, 1), body
    taken = int(body["order_id"])
    view = api("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["bucket_stock_left"], view["pending"]) == ([0, 1, 2, 2], 3), view
    held, away, pending = slots(redis_client, voucher_id, buyer, 0)
    assert (held, away, pending[1]) == (1, [taken], [taken])  # slot at home, unit pending in bucket 1
    assert taken not in pending[0]

    assert invoke_writer(broker_records()) == {"batchItemFailures": []}
    assert slots(redis_client, voucher_id, buyer, 0) == (1, [], [[], [], [], []])  # settled: the slot kept
    assert sql("SELECT bucket FROM t_voucher_order WHERE id = %s", (taken,)) == ((1,),)
    assert bucket_rows(sql, voucher_id) == [0, 1, 2, 2]
    assert order(api, voucher_id, buyer)[0] == "ALREADY_ORDERED"
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [0, 1, 2, 2]


def test_the_reconciler_keeps_the_slot_of_a_persisted_away_order_whose_settle_was_lost(
    api, sql, redis_client, monkeypatch, own_topic
):
    """An away order the DB holds whose away record is still at home (the writer's settle was lost): the reconciler
    ends the record and keeps the buyer's slot (the order stands), every bucket's stock as it was."""
    voucher_id = voucher(api, stock=8, stock_shards=SHARDS)
    first, second, buyer = buyers_homed_at(1, 3)
    assert [order(api, voucher_id, u)[0] for u in (first, second, buyer)] == [200, 200, 200]
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [2, 0, 1, 2]
    away = redis_client.hgetall(keys.voucher_away(voucher_id, 1))
    assert len(away) == 1
    assert invoke_writer(broker_records()) == {"batchItemFailures": []}
    redis_client.hset(keys.voucher_away(voucher_id, 1), mapping=away)  # the settle of the home did not happen
    report = reconcile_totals(monkeypatch, age_s=0)["vouchers"]
    assert report["away_given_back"] == 0
    assert slots(redis_client, voucher_id, buyer, 1) == (1, [], [[], [], [], []])
    assert order(api, voucher_id, buyer)[0] == "ALREADY_ORDERED"
    assert api("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [2, 0, 1, 2]
    assert bucket_rows(sql, voucher_id) == [2, 0, 1, 2]
