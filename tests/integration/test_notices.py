"""Delay queues, payment orders and their close reminders, the app inbox and unfinished-business journeys,
through the API handler (API Gateway events), the drainer and reconciler functions (EventBridge events)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from hotledger import keys
from hotledger.notices.feature import inbox, journeys
from hotledger.runtime import delay_queue
from infra.localrt import events


@pytest.fixture
def queue():
    return f"q-{uuid.uuid4().hex[:8]}"


def now_ms() -> int:
    return int(time.time() * 1000)


# delay queue ------------------------------------------------------------------------------------------------
def test_offer_dedupes_moves_and_removes_in_place(queue):
    dq = delay_queue()
    assert dq.offer(queue, {"b": 1, "a": 2}, delay_ms=60_000) is True
    assert dq.offer(queue, {"a": 2, "b": 1}, delay_ms=120_000) is False  # same element (canonical): due time moved
    assert dq.size(queue) == (1, 0) and dq.contains(queue, '{"a":2,"b":1}')
    assert dq.due_at(queue, {"a": 2, "b": 1}) > now_ms() + 100_000
    assert dq.remove(queue, {"b": 1, "a": 2}) is True and dq.remove(queue, {"b": 1, "a": 2}) is False
    assert dq.size(queue) == (0, 0)


def test_drain_takes_only_what_is_due_and_redelivers_what_was_not_acknowledged(queue, monkeypatch):
    dq = delay_queue()
    t = now_ms()
    for i, due in enumerate([t - 20, t - 10, t + 60_000]):
        dq.offer(queue, f"e{i}", due_at_ms=due)
    taken = dq.drain(queue, t, 10)
    assert [e for e, _ in taken.elements] == ["e0", "e1"] and taken.earliest_due == t + 60_000
    assert dq.size(queue) == (1, 2)
    assert dq.ack(queue, [taken.deliveries[0].receipt]) == [True]
    assert dq.drain(queue, t, 10).elements == []  # e1 is taken, its visibility deadline not reached
    again = dq.drain(queue, t + dq.visibility_ms + 1, 10)
    assert [e for e, _ in again.elements] == ["e1"]  # not acknowledged in time: handed out again


def test_http_offer_remove_view_take_ack(api, queue):
    status, body = api("POST", f"/delay-queues/{queue}/items", {"element": "job-1", "delay_s": 0})
    assert status == 200 and body["new"] is True
    assert api("POST", f"/delay-queues/{queue}/items", {"element": "job-2", "delay_s": 3600})[0] == 200
    view = api("GET", f"/delay-queues/{queue}")[1]
    assert view["size"] == 2 and view["earliest_due_at"] <= now_ms()
    status, taken = api("POST", f"/delay-queues/{queue}/take", {"limit": 10})
    assert [e["element"] for e in taken["elements"]] == ["job-1"]
    assert api("POST", f"/delay-queues/{queue}/ack", {"receipts": [taken["elements"][0]["receipt"]]})[1]["taken"] == 0
    assert api("DELETE", f"/delay-queues/{queue}/items/job-2")[0] == 200
    status, body = api("DELETE", f"/delay-queues/{queue}/items/job-2")
    assert (status, body["error"]["code"]) == (404, "ELEMENT_NOT_FOUND")


@pytest.mark.parametrize(
    "body, code",
    [
        ({"element": "x"}, "VALIDATION_ERROR"),
        ({"element": "x", "delay_s": 1, "due_at": 5}, "VALIDATION_ERROR"),
        ({"element": "x", "delay_s": -1}, "VALIDATION_ERROR"),
        ({"element": "", "delay_s": 1}, "VALIDATION_ERROR"),
        ({"delay_s": 1}, "MISSING_FIELD"),
    ],
)
def test_bad_offers_are_refused(api, queue, body, code):
    status, answer = api("POST", f"/delay-queues/{queue}/items", body)
    assert (status, answer["error"]["code"]) == (422, code)
    assert api("GET", f"/delay-queues/{queue}")[1]["size"] == 0


def test_bad_queue_name_and_reserved_queue(api):
    assert api("GET", "/delay-queues/Bad%20Name")[0] == 422
    status, body = api("POST", "/delay-queues/order-close-reminder/items", {"element": "1", "delay_s": 0})
    assert (status, body["error"]["code"]) == (409, "QUEUE_RESERVED")


def test_drainer_sleeps_until_the_earliest_due_and_is_woken_by_an_earlier_offer(queue):
    from hotledger.dal.delay_queue import Drainer

    fired: dict[str, int] = {}
    drainer = Drainer(
        delay_queue(), {queue: lambda elements: fired.update((e, now_ms()) for e in elements)}, idle_wait_ms=5000
    )
    stop = threading.Event()
    thread = threading.Thread(target=drainer.run, args=(lambda: not stop.is_set(),))
    thread.start()
    try:
        time.sleep(0.3)  # asleep: nothing is due, nothing waiting
        due = now_ms() + 500
        delay_queue().offer(queue, "soon", due_at_ms=due)  # published: the drainer wakes and sleeps until `due`
        deadline = time.monotonic() + 5
        while "soon" not in fired and time.monotonic() < deadline:
            time.sleep(0.01)
        assert due <= fired["soon"] < due + 300  # not early, and not the 5 s idle wait late
    finally:
        stop.set()
        delay_queue().offer(queue, "wake", delay_ms=0)
        thread.join()


# inbox ---------------------------------------------------------------------------------------------------
def test_inbox_post_is_idempotent_and_pull_returns_what_came_after(api):
    user = api.account()
    ids = []
    for n in range(5):
        status, body = api(
            "POST",
            f"/inbox/{user}/messages",
            {"biz_type": "pay", "outer_biz_id": f"o{n}", "title": "Paid", "content": f"payment {n} done"},
        )
        assert status == 200 and body["duplicate"] is False
        ids.append(body["message_id"])
    status, body = api(
        "POST", f"/inbox/{user}/messages", {"biz_type": "pay", "outer_biz_id": "o2", "title": "x", "content": "y"}
    )
    assert body == {"message_id": ids[2], "duplicate": True}
    everything = api("GET", f"/inbox/{user}/messages")[1]["messages"]
    assert [m["message_id"] for m in everything] == ids and everything[0]["content"] == "payment 0 done"
    assert [m["message_id"] for m in api("GET", f"/inbox/{user}/messages?after={ids[2]}")[1]["messages"]] == ids[3:]
    assert [
        m["message_id"] for m in api("GET", f"/inbox/{user}/messages?after={ids[0]}&limit=2")[1]["messages"]
    ] == ids[1:3]
    assert len(api("GET", f"/inbox/{user}/messages?after=123456")[1]["messages"]) == 5  # unknown: everything


def test_concurrent_duplicate_posts_write_one_message(api):
    user = api.account()
    answers = []
    barrier = threading.Barrier(8)

    def post():
        barrier.wait()
        answers.append(inbox().post(user, "refund", "r-1", "Refunded", "your refund is done"))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({message_id for message_id, _ in answers}) == 1 and sum(new for _, new in answers) == 1
    assert len(inbox().pull(user, None, 50)) == 1


def test_inbox_is_trimmed_and_expires(api, redis_client, monkeypatch):
    user = api.account()
    monkeypatch.setattr(inbox(), "max_messages", 3)
    for n in range(6):
        inbox().post(user, "ops", f"m{n}", "t", f"c{n}")
    assert [m.content for m in inbox().pull(user, None, 50)] == ["c3", "c4", "c5"]
    assert redis_client.zcard(keys.inbox_index(user)) == 3
    assert 0 < redis_client.ttl(keys.inbox_index(user)) <= inbox().ttl_s
    monkeypatch.setattr(inbox(), "ttl_s", 1)
    message_id, _ = inbox().post(user, "ops", "short", "t", "short-lived")
    assert 0 < redis_client.ttl(keys.inbox_message(user, message_id)) <= 1


def test_inbox_index_drops_messages_older_than_the_ttl(api, redis_client, monkeypatch):
    """The index is trimmed by age on every post, not only by count: ids of messages past their TTL leave it (they
    would hold memory and fill pages with nothing). The clock is moved, so the old message's body still exists:
    only the age trim keeps it out of the index and the pull (a mutant without the trim survived before)."""
    user = api.account()
    t0 = now_ms()
    monkeypatch.setattr(inbox(), "ttl_s", 60)
    monkeypatch.setattr(inbox(), "now_ms", lambda: t0)
    old_id, _ = inbox().post(user, "ops", "old", "t", "old")
    monkeypatch.setattr(inbox(), "now_ms", lambda: t0 + 60_000)  # exactly the TTL: still kept
    kept_id, _ = inbox().post(user, "ops", "kept", "t", "kept")
    assert redis_client.zrange(keys.inbox_index(user), 0, -1) == [old_id.encode(), kept_id.encode()]
    monkeypatch.setattr(inbox(), "now_ms", lambda: t0 + 60_001)
    new_id, _ = inbox().post(user, "ops", "new", "t", "new")
    assert redis_client.exists(keys.inbox_message(user, old_id))  # its body has not expired yet (real time)
    assert redis_client.zrange(keys.inbox_index(user), 0, -1) == [kept_id.encode(), new_id.encode()]
    assert [m.content for m in inbox().pull(user, None, 50)] == ["kept", "new"]


def test_bad_inbox_input(api):
    user = api.account()
    status, body = api(
        "POST", f"/inbox/{user}/messages", {"biz_type": "a b", "outer_biz_id": "1", "title": "t", "content": "c"}
    )
    assert (status, body["error"]["code"]) == (422, "VALIDATION_ERROR")
    status, body = api("POST", f"/inbox/{user}/messages", raw="{")
    assert (status, body["error"]["code"]) == (400, "MALFORMED_JSON")
    status, body = api(
        "POST", "/inbox/2147483000/messages", {"biz_type": "a", "outer_biz_id": "1", "title": "t", "content": "c"}
    )
    assert (status, body["error"]["code"]) == (404, "ACCOUNT_NOT_FOUND")
    assert api("GET", f"/inbox/{user}/messages?limit=0")[0] == 422


# payment orders and their close reminders ------------------------------------------------------------------
def drain_reminders():
    from delay_drainer.app import handler

    return handler(events.scheduled(), events.LambdaContext("DelayDrainerFunction", timeout_s=4))


def test_order_close_reminder_fires_once_for_open_orders_only(api, monkeypatch):
    from hotledger.notices.feature import payment_orders

    monkeypatch.setattr(payment_orders(), "reminder_before_close_ms", 3_600_000)  # remind an hour before close
    user = api.account(balance="50.00")
    status, open_order = api("POST", "/orders", {"user_id": user, "amount": "5.00", "close_in_s": 3600})
    assert status == 201 and open_order["reminder_due_at"] <= now_ms()
    paid = api("POST", "/orders", {"user_id": user, "amount": "7.00", "close_in_s": 3600})[1]
    closed = api("POST", "/orders", {"user_id": user, "amount": "9.00", "close_in_s": 3600})[1]
    status, body = api("POST", f"/orders/{paid['order_id']}/pay")
    assert status == 200 and body["state"] == "PAID" and body["reminder_due_at"] is None
    assert api("GET", f"/accounts/{user}")[1]["balance"] == "43.00"
    assert api("POST", f"/orders/{closed['order_id']}/close")[1]["state"] == "CLOSED"
    assert api("POST", f"/orders/{closed['order_id']}/pay")[1]["error"]["code"] == "ORDER_CLOSED"
    assert api("POST", f"/orders/{paid['order_id']}/close")[1]["error"]["code"] == "ORDER_PAID"
    assert api("POST", f"/orders/{paid['order_id']}/pay")[0] == 200  # paying twice charges once
    assert api("GET", f"/accounts/{user}")[1]["balance"] == "43.00"

    drain_reminders()
    delay_queue().offer("order-close-reminder", open_order["order_id"], delay_ms=0)  # redelivered: harmless
    drain_reminders()
    messages = inbox().pull(user, None, 50)
    assert [(m.biz_type, m.outer_biz_id) for m in messages] == [("ORDER_CLOSE_REMINDER", open_order["order_id"])]
    assert "closes in 60 minutes" in messages[0].content
    assert api("GET", f"/orders/{open_order['order_id']}")[1]["reminder_due_at"] is None


def test_reminders_redis_lost_are_offered_again_and_fire_once(api, redis_client, monkeypatch):
    from helpers import reconcile_totals
    from hotledger import keys
    from hotledger.notices.feature import payment_orders

    monkeypatch.setattr(payment_orders(), "reminder_before_close_ms", 3_600_000)
    reminded, later, due_now = api.account(), api.account(), api.account()
    reminded_order = api("POST", "/orders", {"user_id": reminded, "amount": "1.00", "close_in_s": 3600})[1]
    drain_reminders()
    assert len(inbox().pull(reminded, None, 50)) == 1
    later_order = api("POST", "/orders", {"user_id": later, "amount": "2.00", "close_in_s": 7200})[1]
    due_now_order = api("POST", "/orders", {"user_id": due_now, "amount": "3.00", "close_in_s": 3600})[1]
    # Redis loses the queue and the inboxes (their messages and idempotency records)
    inbox_keys = list(redis_client.scan_iter(match=f"inbox:*{{inbox{reminded}}}*", count=1000))  # every master's
    assert inbox_keys
    redis_client.delete(keys.delay_due("order-close-reminder"), keys.delay_taken("order-close-reminder"), *inbox_keys)

    assert reconcile_totals()["reminders_reoffered"] >= 2  # a whole pass, whatever each run's budget
    assert api("GET", f"/orders/{later_order['order_id']}")[1]["reminder_due_at"] == later_order["reminder_due_at"]
    assert api("GET", f"/orders/{reminded_order['order_id']}")[1]["reminder_due_at"] is None  # it fired already
    drain_reminders()
    delay_queue().offer("order-close-reminder", reminded_order["order_id"], delay_ms=0)  # fires into reminded_at
    reconcile_totals()
    drain_reminders()
    assert [m.outer_biz_id for m in inbox().pull(due_now, None, 50)] == [due_now_order["order_id"]]
    assert inbox().pull(reminded, None, 50) == [] and inbox().pull(later, None, 50) == []


def test_orders_still_open_at_their_close_time_are_closed(api, redis_client):
    from reconciler.app import handler as reconcile

    from hotledger import keys

    user = api.account(balance="10.00")
    closing, paid, lost = (
        api("POST", "/orders", {"user_id": user, "amount": "1.00", "close_in_s": 1})[1] for _ in range(3)
    )
    assert api("POST", f"/orders/{paid['order_id']}/pay")[0] == 200
    redis_client.zrem(keys.delay_due("order-close"), lost["order_id"])  # Redis lost this one's close
    time.sleep(max(0.0, (max(o["close_at"] for o in (closing, paid, lost)) - now_ms()) / 1000) + 0.05)
    drain_reminders()
    assert api("GET", f"/orders/{closing['order_id']}")[1]["state"] == "CLOSED"
    assert api("GET", f"/orders/{paid['order_id']}")[1]["state"] == "PAID"
    assert api("GET", f"/orders/{lost['order_id']}")[1]["state"] == "OPEN"
    assert reconcile(events.scheduled(), events.LambdaContext("ReconcilerFunction"))["orders_closed"] >= 1
    assert api("GET", f"/orders/{lost['order_id']}")[1]["state"] == "CLOSED"
    assert api("POST", f"/orders/{closing['order_id']}/pay")[1]["error"]["code"] == "ORDER_CLOSED"
    assert api("GET", f"/accounts/{user}")[1]["balance"] == "9.00"
    assert (
        api("POST", "/delay-queues/order-close/items", {"element": "1", "delay_s": 1})[1]["error"]["code"]
        == "QUEUE_RESERVED"
    )


def test_bad_order_input(api):
    user = api.account()
    for body in (
        {"user_id": user, "amount": "1.001", "close_in_s": 60},
        {"user_id": user, "amount": "1.00", "close_in_s": 0},
    ):
        assert api("POST", "/orders", body)[0] == 422
    assert (
        api("POST", "/orders", {"user_id": 2147483000, "amount": "1.00", "close_in_s": 60})[1]["error"]["code"]
        == "ACCOUNT_NOT_FOUND"
    )
    assert api("POST", "/orders/12345/pay")[1]["error"]["code"] == "ORDER_NOT_FOUND"


# journeys ------------------------------------------------------------------------------------------------
def test_unfinished_journey_becomes_one_inbox_message(api, monkeypatch):
    from reconciler.app import handler

    monkeypatch.setattr(journeys(), "thresholds", {"password-recovery": 0})
    done, stuck = api.account(), api.account()
    for user in (done, stuck):
        first = api("POST", f"/journeys/password-recovery/{user}/start")[1]["started_at"]
        assert api("POST", f"/journeys/password-recovery/{user}/start")[1]["started_at"] == first  # repeat: same start
    api("POST", f"/journeys/password-recovery/{done}/finish")
    time.sleep(0.01)
    for _ in range(2):
        handler(events.scheduled(), events.LambdaContext("ReconcilerFunction"))
    assert inbox().pull(done, None, 50) == []
    messages = inbox().pull(stuck, None, 50)
    assert (
        len(messages) == 1
        and messages[0].biz_type == "JOURNEY_password-recovery"
        and "Face recognition" in messages[0].content
    )
    assert api("POST", "/journeys/no-such-biz/1/start")[1]["error"]["code"] == "JOURNEY_NOT_FOUND"
    assert api("POST", "/journeys/password-recovery/2147483000/start")[1]["error"]["code"] == "ACCOUNT_NOT_FOUND"


def test_inbox_keys_are_unambiguous(api):
    """(biz_type, outer_biz_id) = ("a:b", "c") and ("a", "b:c") are two business events, not one."""
    user = api.account()
    first = api(
        "POST", f"/inbox/{user}/messages", {"biz_type": "a:b", "outer_biz_id": "c", "title": "t", "content": "1"}
    )
    second = api(
        "POST", f"/inbox/{user}/messages", {"biz_type": "a", "outer_biz_id": "b:c", "title": "t", "content": "2"}
    )
    assert first[0] == second[0] == 200, (first, second)
    assert second[1]["duplicate"] is False and second[1]["message_id"] != first[1]["message_id"]
    assert [m["content"] for m in api("GET", f"/inbox/{user}/messages")[1]["messages"]] == ["1", "2"]
    again = api(
        "POST", f"/inbox/{user}/messages", {"biz_type": "a", "outer_biz_id": "b:c", "title": "t", "content": "2"}
    )
    assert again[1] == {"message_id": second[1]["message_id"], "duplicate": True}
