"""Flash sale and red packets over HTTP on the local runtime, on both event transports: Kafka (the MSK
consumer) and Redis Streams (the scheduled drainer). Real processes, real Redis, MariaDB and broker."""

from __future__ import annotations

import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import LocalService
from infra import services

TRANSPORTS = {
    "kafka": {},
    "redis-stream": {"EVENT_TRANSPORT": "redis-stream", "STREAM_SHARDS": "2", "STREAM_GROUP": f"e2e-{os.getpid()}"},
}


@pytest.fixture(scope="module", params=list(TRANSPORTS))
def service(request, tmp_path_factory):
    svc = LocalService(
        services.free_port(),
        {
            "HOTLEDGER_LOCAL_SCHEDULE_RATE_S": "1",
            "RECONCILE_AGE_S": "60",
            "HOTLEDGER_API_WORKERS": "4",
            **TRANSPORTS[request.param],
        },
        tmp_path_factory.mktemp("sale") / f"{request.param}.log",
    )
    svc.start()
    yield svc
    svc.stop()


def _many(service, requests, threads: int = 64):
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda r: service.request(*r), requests))


def test_ten_thousand_buyers_one_hundred_units(service, sql):
    now = int(time.time() * 1000)
    status, body = service.request(
        "POST", "/vouchers", {"title": "flash", "stock": 100, "begin_at": now - 1000, "end_at": now + 3_600_000}
    )
    voucher_id = body["voucher_id"]
    users = [1_000_000 + i for i in range(2000)]
    attempts = [("POST", f"/vouchers/{voucher_id}/orders", {"user_id": u}) for _ in range(5) for u in users]
    answers = _many(service, attempts)
    codes = Counter(status if status == 200 else body["error"]["code"] for status, body in answers)
    assert codes[200] == 100, codes
    assert set(codes) <= {200, "SOLD_OUT", "ALREADY_ORDERED"}, codes
    won = {int(body["order_id"]): body["user_id"] for status, body in answers if status == 200}
    assert len(won) == 100 and len(set(won.values())) == 100  # no user with two

    def all_persisted():
        return sql("SELECT COUNT(*) FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,))[0][0] == 100

    service.wait_until(all_persisted, 90, "100 orders in the DB")
    rows = sql("SELECT id, user_id FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,))
    assert dict(rows) == won  # exactly the acknowledged orders, once each
    assert sql("SELECT stock FROM t_seckill_voucher WHERE id = %s", (voucher_id,)) == ((0,),)
    service.wait_until(
        lambda: service.request("GET", f"/vouchers/{voucher_id}")[1]["pending"] == 0, 30, "nothing pending"
    )
    view = service.request("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["stock_left"], view["sold"], view["pending"]) == (0, 100, 0)


def test_a_voucher_over_four_stock_buckets_sells_exactly_its_stock_to_concurrent_buyers(service, sql):
    now = int(time.time() * 1000)
    status, body = service.request(
        "POST",
        "/vouchers",
        {"title": "hot", "stock": 100, "begin_at": now - 1000, "end_at": now + 3_600_000, "stock_shards": 4},
    )
    assert status == 201, body
    voucher_id = body["voucher_id"]
    users = [3_000_000 + i for i in range(1000)]
    answers = _many(
        service, [("POST", f"/vouchers/{voucher_id}/orders", {"user_id": u}) for _ in range(3) for u in users]
    )
    codes = Counter(status if status == 200 else body["error"]["code"] for status, body in answers)
    assert codes[200] == 100 and set(codes) <= {200, "SOLD_OUT", "ALREADY_ORDERED"}, codes
    won = {int(body["order_id"]): body["user_id"] for status, body in answers if status == 200}
    assert len(won) == 100 and len(set(won.values())) == 100  # never oversold, no user twice across buckets
    assert service.request("GET", f"/vouchers/{voucher_id}")[1]["bucket_stock_left"] == [0, 0, 0, 0]

    service.wait_until(
        lambda: sql("SELECT COUNT(*) FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,))[0][0] == 100,
        90,
        "100 orders in the DB",
    )
    assert dict(sql("SELECT id, user_id FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,))) == won
    assert sql(
        "SELECT bucket, COUNT(*) FROM t_voucher_order WHERE voucher_id = %s GROUP BY bucket ORDER BY bucket",
        (voucher_id,),
    ) == ((0, 25), (1, 25), (2, 25), (3, 25))  # every bucket drained, in the DB too
    assert sql("SELECT stock FROM t_voucher_bucket WHERE voucher_id = %s", (voucher_id,)) == ((0,),) * 4
    assert sql("SELECT stock FROM t_seckill_voucher WHERE id = %s", (voucher_id,)) == ((0,),)
    service.wait_until(
        lambda: service.request("GET", f"/vouchers/{voucher_id}")[1]["pending"] == 0, 30, "nothing pending"
    )
    view = service.request("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["stock_left"], view["sold"], view["bucket_stock_left"]) == (0, 100, [0, 0, 0, 0])


def test_thousand_grabbers_one_hundred_packets(service, sql):
    def account(balance=None):
        status, body = service.request("POST", "/accounts", {"user_name": f"rp-{time.monotonic_ns()}"})
        assert status == 201, body
        if balance:
            assert service.request("POST", f"/accounts/{body['user_id']}/recharge", {"amount": balance})[0] == 200
        return body["user_id"]

    sender = account("500.00")
    with ThreadPoolExecutor(16) as pool:
        grabbers = list(pool.map(lambda _: account(), range(1000)))
    status, packet = service.request(
        "POST", "/redpackets", {"sender_id": sender, "total": "100.00", "count": 100, "expires_in_s": 12}
    )
    assert status == 201, packet
    packet_id = packet["packet_id"]
    answers = _many(service, [("POST", f"/redpackets/{packet_id}/grab", {"user_id": u}) for u in grabbers])
    codes = Counter(status if status == 200 else body["error"]["code"] for status, body in answers)
    assert codes == {200: 100, "EMPTY": 900}, codes
    won = {body["user_id"]: int(body["amount"].replace(".", "")) for status, body in answers if status == 200}
    assert sum(won.values()) == 10000 and min(won.values()) >= 1

    def balance(user_id):
        return int(service.request("GET", f"/accounts/{user_id}")[1]["balance"].replace(".", ""))

    # the writer credits a grab once the DB has accepted its claim: wait for the credits, then no one has more
    service.wait_until(lambda: all(balance(u) == amount for u, amount in won.items()), 60, "every grab credited")
    assert all(balance(u) == won.get(u, 0) for u in grabbers[:200] + list(won))
    service.wait_until(
        lambda: service.request("GET", f"/redpackets/{packet_id}")[1]["state"] == "REFUNDED",
        60,
        "the expired packet to be settled",
    )
    view = service.request("GET", f"/redpackets/{packet_id}")[1]
    assert view["refund"] == "0.00" and view["claimed"] == 100
    assert {g["user_id"]: int(g["amount"].replace(".", "")) for g in view["grabs"]} == won
    service.wait_until(
        lambda: (
            sql(
                "SELECT COUNT(*) FROM t_red_packet_item WHERE packet_id = %s AND user_id IS NOT NULL", (int(packet_id),)
            )[0][0]
            == 100
        ),
        60,
        "100 claims in the DB",
    )
    assert balance(sender) == 40000
    placeholders = ",".join(["%s"] * len(won))

    def credits_in_db():
        rows = sql(f"SELECT user_id, balance FROM t_account WHERE user_id IN ({placeholders})", list(won))
        return dict(rows) == won

    service.wait_until(credits_in_db, 60, "every grabber's credit in the DB")
    service.wait_until(
        lambda: sql("SELECT balance FROM t_account WHERE user_id = %s", (sender,)) == ((40000,),),
        60,
        "the sender's debit in the DB",
    )
