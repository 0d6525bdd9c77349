"""Route Idempotency-Keys (red packets, grabs, voucher orders, payment orders, pay) outlive a real Redis loss and a real
SIGKILL of the API process mid-request (issue 10, items 1 and 2): the local runtime over HTTP on a private stack. A
retry with the first request's key and body answers the first answer, and the effect (a packet and its debit, a unit
of stock, a payment order, a charge) happens once."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from decimal import Decimal

import pymysql
import pytest
import redis

from faults.test_faults import _account, stack  # noqa: F401  (stack: the module's private servers)
from helpers import LocalService

LEASE = {"IDEMPOTENCY_LEASE_MS": "1500", "REBUILD_HOLD_S": "2"}


def _key() -> dict:
    return {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}


def _voucher(api: LocalService, per_user_limit: int) -> str:
    now = int(time.time() * 1000)
    status, body = api.request(
        "POST",
        "/vouchers",
        {
            "title": "keys",
            "stock": 10,
            "begin_at": now - 1000,
            "end_at": now + 3_600_000,
            "per_user_limit": per_user_limit,
        },
    )
    assert status == 201, body
    return body["voucher_id"]


def _answered(api: LocalService, method: str, path: str, body, headers, timeout_s: float = 60):
    """The request's answer once it is not a retryable 503 or IN_PROGRESS (a rebuild's hold, a dead attempt's lease)."""
    seen = []

    def answered():
        seen.append(api.request(method, path, body, headers))
        status, answer = seen[-1]
        return status not in (0, 503) and not (status == 409 and answer["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS")

    LocalService.wait_until(answered, timeout_s, f"an answer to {method} {path}", 0.3)
    return seen[-1]


def _lose_redis(stack) -> None:  # noqa: F811
    stack.redis.kill()
    stack.redis.restart()


def test_route_keys_and_their_refusals_outlive_redis_restarted_empty(stack):  # noqa: F811
    api = stack.service("api-route-keys", **LEASE).start()
    try:
        sender, grabber, payer = _account(api, "10.00"), _account(api, "0.01"), _account(api, "5.00")
        first = {}

        def ask(name, method, path, body=None):
            headers = _key()
            first[name] = (method, path, body, headers, api.request(method, path, body, headers))

        ask("packet", "POST", "/redpackets", {"sender_id": sender, "total": "4.00", "count": 2})
        packet_id = first["packet"][4][1]["packet_id"]
        ask("grab", "POST", f"/redpackets/{packet_id}/grab", {"user_id": grabber})
        ask("order", "POST", "/orders", {"user_id": payer, "amount": "3.00", "close_in_s": 600})
        unpaid = api.request("POST", "/orders", {"user_id": payer, "amount": "9.00", "close_in_s": 600})[1]["order_id"]
        ask("pay refused", "POST", f"/orders/{unpaid}/pay")
        multi, single = _voucher(api, per_user_limit=2), _voucher(api, per_user_limit=1)
        ask("multi order", "POST", f"/vouchers/{multi}/orders", {"user_id": payer})
        ask("single order", "POST", f"/vouchers/{single}/orders", {"user_id": payer})
        statuses = {name: answer[4][0] for name, answer in first.items()}
        assert statuses == {
            "packet": 201,
            "grab": 200,
            "order": 201,
            "pay refused": 402,
            "multi order": 200,
            "single order": 200,
        }, first
        LocalService.wait_until(
            lambda: (
                stack.sql("SELECT COUNT(*) FROM t_voucher_order WHERE user_id = %s", (payer,)) == ((2,),)
                and stack.sql("SELECT COUNT(*) FROM t_red_packet_item WHERE user_id = %s", (grabber,)) == ((1,),)
            ),
            60,
            "the orders and the claim in the DB",
        )
        _lose_redis(stack)
        # the refused pay would succeed now: its key must still answer the refusal
        assert api.request("POST", f"/accounts/{payer}/recharge", {"amount": "20.00"})[0] == 200
        for name, (method, path, body, headers, answer) in first.items():
            assert _answered(api, method, path, body, headers) == answer, name
        assert stack.sql("SELECT COUNT(*) FROM t_red_packet WHERE sender_id = %s", (sender,)) == ((1,),)
        assert api.request("GET", f"/accounts/{sender}")[1]["balance"] == "6.00"  # one debit
        credited = str(Decimal(first["grab"][4][1]["amount"]) + Decimal("0.01"))
        LocalService.wait_until(
            lambda: api.request("GET", f"/accounts/{grabber}")[1]["balance"] == credited, 60, "the grabber's one credit"
        )
        assert stack.sql("SELECT COUNT(*) FROM t_payment_order WHERE user_id = %s", (payer,)) == ((2,),)
        assert api.request("GET", f"/orders/{unpaid}")[1]["state"] == "OPEN"
        assert api.request("GET", f"/accounts/{payer}")[1]["balance"] == "25.00"  # never charged
        assert stack.sql(
            "SELECT voucher_id, COUNT(*) FROM t_voucher_order WHERE user_id = %s GROUP BY voucher_id"
            " ORDER BY voucher_id",
            (payer,),
        ) == ((int(multi), 1), (int(single), 1))
    finally:
        api.stop()


def _inserts_waiting(stack) -> bool:  # noqa: F811
    return bool(
        stack.sql(
            "SELECT 1 FROM information_schema.PROCESSLIST WHERE INFO LIKE 'INSERT INTO t_payment_order%'"
            " AND ID <> CONNECTION_ID()"
        )
    )


def _in_background(call) -> threading.Thread:
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("redis_lost", [False, True], ids=["killed", "killed-then-redis-lost"])
def test_a_payment_order_whose_api_process_was_killed_mid_request_is_created_once(stack, redis_lost):  # noqa: F811
    api = stack.service("api-order-kill", **LEASE).start()
    user = _account(api, "1.00")
    request, headers = {"user_id": user, "amount": "3.00", "close_in_s": 600}, _key()
    # hold the gap above every payment order id so the API's INSERT waits on it; meanwhile pause Redis's writers, then
    # release the gap: the INSERT commits and the API waits on Redis to queue the order's reminder; SIGKILLed there,
    # the order exists and its answer was never given
    gap = pymysql.connect(host="127.0.0.1", port=stack.db.port, user="root", password="", database="hotledger")
    paused = redis.Redis(port=stack.redis.port)
    try:
        with gap.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(
                "SELECT id FROM t_payment_order WHERE id > (SELECT COALESCE(MAX(id), 0) FROM t_payment_order)"
                " FOR UPDATE"
            )
            attempt = _in_background(lambda: api.request("POST", "/orders", request, headers))
            LocalService.wait_until(lambda: _inserts_waiting(stack), 30, "the API's INSERT to wait on the gap")
            paused.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
            cur.execute("COMMIT")
        LocalService.wait_until(
            lambda: stack.sql("SELECT COUNT(*) FROM t_payment_order WHERE user_id = %s", (user,)) == ((1,),),
            15,
            "the attempt's INSERT to commit",
        )
        api.kill()
    finally:
        paused.execute_command("CLIENT", "UNPAUSE")
        gap.close()
    attempt.join(30)
    if redis_lost:
        _lose_redis(stack)
    api = stack.service("api-order-retry", **LEASE).start()
    try:
        status, body = _answered(api, "POST", "/orders", request, headers)
        assert status == 201, body
        assert stack.sql("SELECT id FROM t_payment_order WHERE user_id = %s", (user,)) == ((int(body["order_id"]),),)
        assert api.request("POST", "/orders", request, headers) == (status, body)
    finally:
        api.stop()


@pytest.mark.parametrize("redis_lost", [False, True], ids=["killed", "killed-then-redis-lost"])
def test_a_multi_unit_voucher_order_whose_api_process_was_killed_mid_request_takes_one_unit(stack, redis_lost):  # noqa: F811
    api = stack.service("api-voucher-kill", **LEASE).start()
    voucher_id = _voucher(api, per_user_limit=3)
    buyer = _account(api, "1.00")
    request, headers = {"user_id": buyer}, _key()
    pending = redis.Redis(port=stack.redis.port)
    os.kill(stack.broker.proc.pid, signal.SIGSTOP)  # the order is taken in Redis, its publish waits for the ack
    try:
        attempt = _in_background(lambda: api.request("POST", f"/vouchers/{voucher_id}/orders", request, headers))
        LocalService.wait_until(
            lambda: pending.hlen(f"voucher:pending:{{v{voucher_id}}}") == 1, 30, "the unit taken in Redis"
        )
        api.kill()
    finally:
        os.kill(stack.broker.proc.pid, signal.SIGCONT)
    attempt.join(30)
    if redis_lost:
        _lose_redis(stack)
    api = stack.service("api-voucher-retry", **LEASE).start()
    try:
        status, body = _answered(api, "POST", f"/vouchers/{voucher_id}/orders", request, headers)
        assert status == 200 and body["seq"] == 1, body

        def persisted():
            return stack.sql("SELECT id FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,)) == (
                (int(body["order_id"]),),
            )

        LocalService.wait_until(persisted, 60, "the one order in the DB")
        assert api.request("POST", f"/vouchers/{voucher_id}/orders", request, headers) == (status, body)
        view = api.request("GET", f"/vouchers/{voucher_id}")[1]
        assert (view["sold"], view["stock_left"]) == (1, 9), view
    finally:
        api.stop()
