"""Delay queues at their edges (issue 10, items 16 and 17): every delivery has its own receipt, so a late ack of an
earlier delivery cannot remove the lease of a newer one; a failing handler is retried with exponential backoff and,
after max_deliveries, its element moves to the queue's dead letters (listed, replayed and dropped over HTTP) while
the drainer goes on serving the other queues. Real Redis, through the API handler and the delay drainer handler."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest

from hotledger.runtime import delay_queue


@pytest.fixture
def queue():
    return f"q-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def short_visibility(monkeypatch):
    monkeypatch.setattr(delay_queue(), "visibility_ms", 200)


def test_a_late_ack_of_an_earlier_delivery_does_not_remove_the_newer_lease(api, queue, short_visibility):
    """Failing first: ack removed by element name, so consumer A (whose lease ran out) acknowledging late removed
    consumer B's lease of the redelivered element, and a B that then died lost the element for good."""
    assert api("POST", f"/delay-queues/{queue}/items", {"element": "job-1", "delay_s": 0})[0] == 200
    first = api("POST", f"/delay-queues/{queue}/take", {"limit": 10})[1]["elements"]
    assert [(e["element"], e["deliveries"]) for e in first] == [("job-1", 1)]
    time.sleep(0.3)  # A's visibility timeout passes: the element is handed out again, to B
    second = api("POST", f"/delay-queues/{queue}/take", {"limit": 10})[1]["elements"]
    assert [(e["element"], e["deliveries"]) for e in second] == [("job-1", 2)]
    assert first[0]["receipt"] != second[0]["receipt"]
    status, body = api("POST", f"/delay-queues/{queue}/ack", {"receipts": [first[0]["receipt"]]})  # A, late
    assert status == 200 and body["taken"] == 1 and body["acknowledged"] == 0
    assert body["stale_receipts"] == [first[0]["receipt"]]
    time.sleep(0.3)  # B died without acknowledging: its lease runs out and the element comes back
    third = api("POST", f"/delay-queues/{queue}/take", {"limit": 10})[1]["elements"]
    assert [(e["element"], e["deliveries"]) for e in third] == [("job-1", 3)]
    status, body = api("POST", f"/delay-queues/{queue}/ack", {"receipts": [third[0]["receipt"]]})
    assert (status, body["taken"], body["acknowledged"], body["stale_receipts"]) == (200, 0, 1, [])


def after_redis_stalls(redis_server, method):
    """`method`, called once Redis is paused (SIGSTOP): its commands wait in Redis's socket past the client's
    timeout, and run when the test resumes Redis (SIGCONT)."""

    def stalled(*args):
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        return method(*args)

    return stalled


@pytest.mark.single_redis
def test_an_ack_whose_answer_redis_lost_says_it_may_have_been_made(api, queue, redis_server, monkeypatch, capfd):
    """Redis stalls (a real SIGSTOP, past the client's socket timeout) as the ack goes out: the ack runs once Redis
    resumes, so the answer must be 503 OUTCOME_UNKNOWN ("may have been made"). Failing first: 503
    SERVICE_UNAVAILABLE, "nothing was changed", while the element was acknowledged for good."""
    for element in ("job-1", "job-2"):
        api("POST", f"/delay-queues/{queue}/items", {"element": element, "delay_s": 0})
    first, second = (e["receipt"] for e in api("POST", f"/delay-queues/{queue}/take", {"limit": 10})[1]["elements"])
    # Redis has the ack script now: the EVALSHA that waits in its socket runs when it resumes (not NOSCRIPT)
    assert api("POST", f"/delay-queues/{queue}/ack", {"receipts": [first]})[1]["acknowledged"] == 1
    monkeypatch.setattr(delay_queue(), "ack", after_redis_stalls(redis_server, delay_queue().ack))
    capfd.readouterr()
    try:
        status, body = api("POST", f"/delay-queues/{queue}/ack", {"receipts": [second]})
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    monkeypatch.undo()
    assert (status, body["error"]["code"]) == (503, "OUTCOME_UNKNOWN"), body
    assert "may have been made" in body["error"]["message"]
    assert "nothing was changed" not in body["error"]["message"]
    rejections = [r["code"] for r in emf_records(capfd.readouterr().out) if "Rejections" in r]
    assert rejections == ["OUTCOME_UNKNOWN"], rejections  # counted under its own code
    view = api("GET", f"/delay-queues/{queue}")[1]  # the ack Redis ran when it resumed
    assert (view["size"], view["taken"]) == (0, 0), view


@pytest.mark.single_redis
def test_a_read_whose_answer_redis_lost_still_says_nothing_was_changed(api, queue, redis_server, monkeypatch):
    """A read changes nothing whatever became of its commands: 503 SERVICE_UNAVAILABLE, not OUTCOME_UNKNOWN."""
    api("POST", f"/delay-queues/{queue}/items", {"element": "job-1", "delay_s": 0})
    monkeypatch.setattr(delay_queue(), "stats", after_redis_stalls(redis_server, delay_queue().stats))
    try:
        status, body = api("GET", f"/delay-queues/{queue}")
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    assert (status, body["error"]["code"]) == (503, "SERVICE_UNAVAILABLE"), body


def test_extend_by_receipt_keeps_the_lease_and_a_stale_receipt_extends_nothing(api, queue, short_visibility):
    api("POST", f"/delay-queues/{queue}/items", {"element": "job-1", "delay_s": 0})
    first = api("POST", f"/delay-queues/{queue}/take", {"limit": 10})[1]["elements"][0]
    status, body = api("POST", f"/delay-queues/{queue}/extend", {"receipts": [first["receipt"]], "visibility_ms": 5000})
    assert (status, body["extended"], body["stale_receipts"]) == (200, 1, [])
    time.sleep(0.3)
    assert api("POST", f"/delay-queues/{queue}/take", {"limit": 10})[1]["elements"] == []  # still A's
    assert api("POST", f"/delay-queues/{queue}/ack", {"receipts": [first["receipt"]]})[1]["acknowledged"] == 1
    status, body = api("POST", f"/delay-queues/{queue}/extend", {"receipts": [first["receipt"]], "visibility_ms": 5000})
    assert (status, body["extended"], body["stale_receipts"]) == (200, 0, [first["receipt"]])


def test_an_ack_by_element_is_refused_and_changes_nothing(api, queue):
    """Issue 19 item 14: only receipts acknowledge (the by-element form was never released)."""
    api("POST", f"/delay-queues/{queue}/items", {"element": "job-1", "delay_s": 0})
    assert len(api("POST", f"/delay-queues/{queue}/take", {"limit": 10})[1]["elements"]) == 1
    status, body = api("POST", f"/delay-queues/{queue}/ack", {"elements": ["job-1"]})
    assert (status, body["error"]["code"]) == (422, "MISSING_FIELD"), body
    assert api("GET", f"/delay-queues/{queue}")[1]["taken"] == 1


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"receipts": []},
        {"receipts": ["no-colon"]},
        {"receipts": ["x:job"]},
        {"elements": ["a"], "receipts": ["1:a"]},
    ],
)
def test_bad_acks_are_refused_and_change_nothing(api, queue, body):
    api("POST", f"/delay-queues/{queue}/items", {"element": "a", "delay_s": 0})
    api("POST", f"/delay-queues/{queue}/take", {"limit": 10})
    status, answer = api("POST", f"/delay-queues/{queue}/ack", body)
    assert status == 422 and answer["error"]["code"] in ("VALIDATION_ERROR", "MISSING_FIELD"), answer
    assert api("GET", f"/delay-queues/{queue}")[1]["taken"] == 1


# item 17: failures do not stop the drainer ------------------------------------------------------------------
def drain(timeout_s: int = 4) -> dict:
    from delay_drainer.app import handler

    from infra.localrt import events

    return handler(events.scheduled(), events.LambdaContext("DelayDrainerFunction", timeout_s=timeout_s))


def drain_until_dead(queue: str, runs: int = 10) -> dict:
    """Drainer runs until one dead-letters an element of `queue`: a run's window is short and other tests' due
    elements share it, so three deliveries with their backoff may span more than one run. Returns the queue's counts
    over those runs."""
    total = {"failures": 0, "dead_lettered": 0, "redeliveries": 0}
    for _ in range(runs):
        seen = drain()["queues"].get(queue, {})
        total = {name: total[name] + seen.get(name, 0) for name in total}
        if total["dead_lettered"]:
            break
    return total


def emf_records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{") and '"_aws"' in line]


def test_a_poison_element_is_retried_with_backoff_then_dead_lettered_and_later_queues_are_served(
    api, monkeypatch, capsys
):
    """Failing first: a reminder element the handler cannot parse raised out of the drainer handler, so the run
    ended and the order-close and red-packet-expiry queues after it were never served while it stayed there."""
    from hotledger.notices.payment_orders import CLOSE_QUEUE, REMINDER_QUEUE

    dq = delay_queue()
    monkeypatch.setattr(dq, "max_deliveries", 3)
    monkeypatch.setattr(dq, "retry_base_ms", 100)
    poison, missing_order = f"poison-{uuid.uuid4().hex[:8]}", str(9_000_000_000_000 + uuid.uuid4().int % 10**9)
    dq.offer(REMINDER_QUEUE, poison, delay_ms=0)  # first queue served; int(poison) raises in fire_reminders
    dq.offer(CLOSE_QUEUE, missing_order, delay_ms=0)  # a later queue: closing an unknown order is a no-op
    capsys.readouterr()
    reminders = drain_until_dead(REMINDER_QUEUE)
    assert not dq.contains(CLOSE_QUEUE, missing_order)  # the later queue was served
    assert (reminders["failures"], reminders["dead_lettered"], reminders["redeliveries"]) == (3, 1, 2)
    assert not dq.contains(REMINDER_QUEUE, poison)  # neither waiting nor taken: a dead letter
    records = emf_records(capsys.readouterr().out)
    per_queue = {r["queue"]: r for r in records if "queue" in r}
    assert per_queue[REMINDER_QUEUE]["DelayDeadLetters"][0] >= 1  # the last run's record: the dead letter waits
    assert {"DelayQueueDepth", "DelayOldestDueLagMs", "DelayDeadLettered"} <= per_queue[CLOSE_QUEUE].keys()

    status, body = api("GET", f"/delay-queues/{REMINDER_QUEUE}/dead-letters")
    mine = [d for d in body["dead_letters"] if d["element"] == poison]
    assert status == 200 and len(mine) == 1 and mine[0]["deliveries"] == 3
    assert api("GET", f"/delay-queues/{REMINDER_QUEUE}")[1]["dead_letters"] >= 1

    status, body = api("POST", f"/delay-queues/{REMINDER_QUEUE}/dead-letters/replay", {"elements": [poison, "nope"]})
    assert (status, body) == (200, {"replayed": [poison], "not_found": ["nope"]})
    logged = [line for line in api("GET", "/ops/log?limit=50")[1] if line["action"] == "replay.delay"]
    assert logged[0]["detail"] == {"queue": REMINDER_QUEUE, "replayed": [poison], "not_found": ["nope"]}  # who, what
    assert dq.contains(REMINDER_QUEUE, poison) and dq.due_at(REMINDER_QUEUE, poison) <= int(time.time() * 1000)
    again = drain_until_dead(REMINDER_QUEUE)  # replayed with its count reset: three more deliveries, then dead again
    assert (again["failures"], again["dead_lettered"]) == (3, 1)

    status, body = api("DELETE", f"/delay-queues/{REMINDER_QUEUE}/dead-letters/{poison}")
    assert status == 200 and poison not in [d["element"] for d in body["dead_letters"]]
    status, body = api("DELETE", f"/delay-queues/{REMINDER_QUEUE}/dead-letters/{poison}")
    assert (status, body["error"]["code"]) == (404, "ELEMENT_NOT_FOUND")
    assert not dq.contains(REMINDER_QUEUE, poison)


def test_a_consumer_that_keeps_dying_on_an_element_has_it_dead_lettered_at_take(api, queue, monkeypatch):
    """The lease of the max_deliveries-th delivery ran out (no ack, no failure report: the consumer died on it):
    the next take moves it to the dead letters instead of handing it out again."""
    dq = delay_queue()
    monkeypatch.setattr(dq, "visibility_ms", 100)
    monkeypatch.setattr(dq, "max_deliveries", 2)
    api("POST", f"/delay-queues/{queue}/items", {"element": "crashes-consumers", "delay_s": 0})
    for n in (1, 2):
        taken = api("POST", f"/delay-queues/{queue}/take", {"limit": 10})[1]["elements"]
        assert [e["deliveries"] for e in taken] == [n]
        time.sleep(0.15)
    assert api("POST", f"/delay-queues/{queue}/take", {"limit": 10})[1]["elements"] == []
    view = api("GET", f"/delay-queues/{queue}")[1]
    assert (view["size"], view["taken"], view["dead_letters"]) == (0, 0, 1)
    assert api("POST", f"/delay-queues/{queue}/items", {"element": "crashes-consumers", "delay_s": 0})[0] == 200
    view = api("GET", f"/delay-queues/{queue}")[1]  # offered again: starts afresh, out of the dead letters
    assert (view["size"], view["dead_letters"]) == (1, 0)
    assert api("POST", f"/delay-queues/{queue}/take", {"limit": 10})[1]["elements"][0]["deliveries"] == 1


def test_a_receipt_handed_out_before_a_failover_never_matches_a_delivery_after_it(api, queue, redis_client):
    """Receipts are seeded past what was handed out (issue 19): a replica promoted after missing the last take (the
    element back to waiting, the delivery counter one take behind) handed the same sequence, so the same receipt,
    to the next delivery, and the first consumer's late ack removed the new consumer's lease."""
    from hotledger import keys

    api("POST", f"/delay-queues/{queue}/items", {"element": "job", "delay_s": 0})
    counter_before = int(redis_client.get(keys.delay_seq(queue)) or 0)
    (first,) = api("POST", f"/delay-queues/{queue}/take", {"limit": 1})[1]["elements"]
    # the failover: the replica never saw that take
    redis_client.zrem(keys.delay_taken(queue), "job")
    redis_client.hdel(keys.delay_receipts(queue), "job")
    redis_client.zadd(keys.delay_due(queue), {"job": first["due_at"]})
    if counter_before:
        redis_client.set(keys.delay_seq(queue), counter_before)
    else:
        redis_client.set(keys.delay_seq(queue), int(first["receipt"].split(":")[0]) - 1)
    # a failover takes seconds: Redis's clock, which seeds the receipts (1000 per ms), has moved on by then. Without
    # this the second take could fall in the first's millisecond (seen in CI) and be handed the same receipt
    time.sleep(0.002)
    (second,) = api("POST", f"/delay-queues/{queue}/take", {"limit": 1})[1]["elements"]
    assert second["receipt"] != first["receipt"]
    body = api("POST", f"/delay-queues/{queue}/ack", {"receipts": [first["receipt"]]})[1]
    assert (body["acknowledged"], body["taken"]) == (0, 1), body  # the late ack is stale: the new lease stands
    assert api("POST", f"/delay-queues/{queue}/ack", {"receipts": [second["receipt"]]})[1]["acknowledged"] == 1
