"""Issue 21, balance monitors: one alert per crossing, re-armed only past the re-arm line (hysteresis), judged where
the changes are booked; each crossing is a balance.below webhook event and one inbox message. Through the API
handler, the writer and the reconciler functions on the real Redis and DB."""

import pytest

from helpers import Api, invoke_writer, ledger_records, reconcile_totals


def _persist(redis_client, user_id):
    assert invoke_writer(ledger_records(redis_client, [user_id])) == {"batchItemFailures": []}


def _monitor(api, user_id, body):
    status, answer = api("POST", f"/accounts/{user_id}/monitors", body)
    assert status == 201, answer
    return answer


def _charge(api, user_id, path, amount):
    status, body = api("POST", f"/accounts/{user_id}/{path}", {"amount": amount})
    assert status == 200, body


def test_one_alert_per_crossing_rearmed_only_past_the_line(api, redis_client, sql):
    user_id = api.account(balance="50.00")
    _persist(redis_client, user_id)
    monitor = _monitor(api, user_id, {"below": "10.00", "rearm_above": "20.00"})
    assert (monitor["direction"], monitor["threshold"], monitor["rearm"], monitor["armed"]) == (
        "below",
        "10.00",
        "20.00",
        True,
    )
    for path, amount in (
        ("deduct", "41.00"),  # 9.00: crosses
        ("deduct", "1.00"),  # 8.00: still below, no second alert
        ("recharge", "7.00"),  # 15.00: above the line, not past the re-arm line
        ("deduct", "10.00"),  # 5.00: no alert (not re-armed)
        ("recharge", "20.00"),  # 25.00: re-armed
        ("deduct", "17.00"),
    ):  # 8.00: crosses again
        _charge(api, user_id, path, amount)
    _persist(redis_client, user_id)  # one batch: judged entry by entry, in seq order
    alerts = sql(
        "SELECT seq, balance FROM t_monitor_alert WHERE monitor_id = %s ORDER BY seq", (int(monitor["monitor_id"]),)
    )
    assert alerts == ((2, 900), (7, 800))
    assert api("GET", f"/accounts/{user_id}/monitors")[1][0]["armed"] is False

    reconcile_totals()
    reconcile_totals()  # posted once: the inbox keeps one message per crossing
    status, inbox = Api(user_id=user_id, scopes=())("GET", f"/inbox/{user_id}/messages")
    assert status == 200
    titles = [m["title"] for m in inbox["messages"] if m["biz_type"] == "balance.below"]
    assert titles == ["Balance below 10.00", "Balance below 10.00"]


@pytest.mark.parametrize("rearm, crossings", [("10.00", 100), ("20.00", 1)])
def test_oscillations_around_the_line_give_exactly_the_crossings(api, redis_client, sql, rearm, crossings):
    """200 charges of 1.00 swinging across 10.00: without hysteresis each swing below is a crossing (100); with a
    re-arm line at 20.00 never reached again, one."""
    user_id = api.account(balance="10.00")
    _persist(redis_client, user_id)
    monitor = _monitor(api, user_id, {"below": "10.00", "rearm_above": rearm})
    for _ in range(100):
        _charge(api, user_id, "deduct", "1.00")  # 9.00
        _charge(api, user_id, "recharge", "1.00")  # 10.00
    _persist(redis_client, user_id)
    count = sql("SELECT COUNT(*) FROM t_monitor_alert WHERE monitor_id = %s", (int(monitor["monitor_id"]),))[0][0]
    assert count == crossings


def test_a_crossing_is_a_webhook_event_with_the_entrys_seq(api, redis_client, sql, monkeypatch):
    from standardwebhooks import Webhook

    from helpers import Receiver
    from hotledger.webhooks.feature import webhooks

    monkeypatch.setattr(webhooks(), "allow_local", True)
    receiver = Receiver()
    try:
        status, endpoint = api(
            "POST", "/webhook-endpoints", {"url": receiver.url, "event_types": ["balance.below", "charge.persisted"]}
        )
        user_id = api.account(balance="5.00", deduct_type="SYNC")
        _monitor(api, user_id, {"below": "2.00"})
        _charge(api, user_id, "deduct", "4.00")
        webhooks().send_due()
        mine = [
            e
            for e in (Webhook(endpoint["secret"]).verify(b, h) for h, b in receiver.got)
            if e["data"]["user_id"] == user_id
        ]
        assert [(e["type"], e["data"]["seq"]) for e in mine] == [("charge.persisted", 2), ("balance.below", 2)]
        assert mine[1]["data"]["balance"] == "1.00" and mine[1]["data"]["prev_seq"] == 2
    finally:
        receiver.close()


def test_monitor_requests(api):
    user_id = api.account(balance="5.00")
    for body, code in (
        ({"below": "1.00", "above": "2.00"}, "VALIDATION_ERROR"),
        ({}, "VALIDATION_ERROR"),
        ({"below": "10.00", "rearm_above": "5.00"}, "INVALID_MONITOR"),
        ({"above": "10.00", "rearm_above": "5.00"}, "VALIDATION_ERROR"),
        ({"below": "1.001"}, "INVALID_AMOUNT"),
    ):
        status, answer = api("POST", f"/accounts/{user_id}/monitors", body)
        assert (status, answer["error"]["code"]) == (422, code), (body, answer)
    monitor = _monitor(api, user_id, {"above": "100.00", "rearm_below": "90.00"})
    assert Api(user_id=user_id + 1, scopes=())("GET", f"/accounts/{user_id}/monitors")[0] == 403
    assert Api(user_id=user_id, scopes=())("DELETE", f"/accounts/{user_id}/monitors/{monitor['monitor_id']}")[0] == 204
    status, answer = api("DELETE", f"/accounts/{user_id}/monitors/{monitor['monitor_id']}")
    assert (status, answer["error"]["code"]) == (404, "MONITOR_NOT_FOUND")
