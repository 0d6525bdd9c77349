"""Resend after settle, Redis Streams transport, end to end (issue 10, item 5): the first charge script runs and
its reply is lost; before redis-py's resend arrives the stream consumer persists the charge and settles it; the
resend must answer the first charge, not charge again."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from hotledger.ledger.feature import ledger
from hotledger.vouchers.feature import vouchers
from integration.test_redis_attempts import DropAfterScript, proxied_lua, through_proxy
from integration.test_streams import drain_once, stream_mode  # noqa: F401 (fixture)


def _reply_lost_after_settle(stream_mode, settings, monkeypatch, script_name: str, store, request):  # noqa: F811
    """Run `request()` with `script_name`'s first reply lost; the stream consumer persists and settles the change
    before redis-py resends it. Returns (what the consumer applied in between, the request's answer)."""
    url = urlparse(settings.redis_url)
    persisted = []
    proxy = DropAfterScript(
        (url.hostname, url.port), refuse=False, between=lambda: persisted.append(drain_once(stream_mode).applied)
    )
    try:
        lua = proxied_lua(settings, proxy)
        script = lua._scripts[script_name]
        lua.client.script_load(script.script)
        proxy.arm(script.sha)
        with monkeypatch.context() as m:
            through_proxy(m, store, lua)
            answer = request()
    finally:
        proxy.close()
    assert proxy.fired.is_set()
    return persisted, answer


@pytest.mark.single_redis  # through the proxy in front of one Redis (test_redis_attempts)
def test_a_deduct_resent_after_the_stream_consumer_settled_it_charges_once(
    stream_mode,  # noqa: F811 (the fixture)
    api,
    sql,
    settings,
    monkeypatch,
):
    """Before the fix: 200 with balance 80.00 after a 10.00 deduct on 100.00 (charged twice), a second
    event with the same id in the stream."""
    user_id = api.account(balance="100.00")
    assert drain_once(stream_mode).applied == 1  # the recharge is in the DB
    persisted, (status, body) = _reply_lost_after_settle(
        stream_mode,
        settings,
        monkeypatch,
        "ledger_apply",
        ledger().store,
        lambda: api("POST", f"/accounts/{user_id}/deduct", {"amount": "10.00"}),
    )
    assert persisted == [1]  # the charge reached the DB before the resend
    assert status == 200 and body["balance"] == "90.00", body
    assert drain_once(stream_mode, 0.5).applied == 0  # no second event
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((9000,),)
    assert sql("SELECT id FROM t_order WHERE user_id = %s", (user_id,)) == ((int(body["order_id"]),),)
    account = api("GET", f"/accounts/{user_id}")[1]
    assert (account["balance"], account["pending_orders"]) == ("90.00", 0)
    status, order = api("GET", f"/accounts/{user_id}/orders/{body['order_id']}")
    assert status == 200 and order["status"] == "PERSISTED"


@pytest.mark.single_redis
def test_a_voucher_order_resent_after_the_stream_consumer_settled_it_takes_one_unit(
    stream_mode,  # noqa: F811 (the fixture)
    api,
    sql,
    settings,
    monkeypatch,
):
    """Before the fix: the resend took a second unit (stock_left 3 of 5) and a second event under one order id."""
    status, body = api(
        "POST", "/vouchers", {"title": "s", "stock": 5, "begin_at": 0, "end_at": 2**41, "per_user_limit": 2}
    )
    voucher_id = int(body["voucher_id"])
    persisted, (status, order) = _reply_lost_after_settle(
        stream_mode,
        settings,
        monkeypatch,
        "voucher_order",
        vouchers().redis,
        lambda: api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": 42}),
    )
    assert persisted == [1]
    assert status == 200 and order["seq"] == 1, order
    assert drain_once(stream_mode, 0.5).applied == 0
    assert sql("SELECT id, user_id, seq FROM t_voucher_order WHERE voucher_id = %s", (voucher_id,)) == (
        (int(order["order_id"]), 42, 1),
    )
    view = api("GET", f"/vouchers/{voucher_id}")[1]
    assert (view["stock_left"], view["sold"], view["pending"]) == (4, 1, 0)
