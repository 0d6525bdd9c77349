"""Replies of the scripts that refuse in one quiet word (issue 35, class 2 of the issue: every reply of every script):
a lock renewal by a caller that does not own the lock, an extension and a retry with a receipt that is no longer
current, a compare-and-set that lost its race (a journey started again while its reminder was being posted), and a
rebuild that found the voucher's buckets live. Each test drives the script through the code that runs it and
asserts the reply it is about (tests/lua_replies.py records it for the suite's check) and that nothing changed."""

from __future__ import annotations

import time
import uuid

from lua_replies import produced

from helpers import voucher
from hotledger import keys


def _queue() -> str:
    return f"refusals-{uuid.uuid4().hex[:8]}"


def test_a_lock_renewal_by_a_caller_that_does_not_own_the_lock_changes_nothing(redis_client):
    from hotledger.dal.lock import AcquireStatus, lock_acquire, lock_renew
    from hotledger.dal.redis_store import lua

    name = f"refusals-{uuid.uuid4().hex[:8]}"
    assert lock_acquire(lua(), name, "owner-a", 5_000, 0).status is AcquireStatus.ACQUIRED
    ttl = redis_client.pttl(keys.lock(name))
    with produced() as replies:
        assert lock_renew(lua(), name, "owner-b", 60_000) is False
    assert replies == {("lock_renew", "0")}
    assert redis_client.pttl(keys.lock(name)) <= ttl  # the lease was not pushed out for the owner
    with produced() as replies:
        assert lock_renew(lua(), name, "owner-a", 60_000) is True
    assert replies == {("lock_renew", "1")} and redis_client.pttl(keys.lock(name)) > 5_000


def test_an_extension_with_a_receipt_no_longer_current_changes_nothing(api, redis_client):
    queue = _queue()
    assert api("POST", f"/delay-queues/{queue}/items", {"element": "e1", "delay_s": 0})[0] == 200
    status, taken = api("POST", f"/delay-queues/{queue}/take", {"limit": 1})
    assert status == 200 and len(taken["elements"]) == 1, taken
    current = taken["elements"][0]["receipt"]
    sequence, element = current.split(":", 1)
    earlier = f"{int(sequence) - 1}:{element}"  # an earlier delivery's receipt
    deadline = redis_client.zscore(keys.delay_taken(queue), "e1")
    with produced() as replies:
        status, body = api("POST", f"/delay-queues/{queue}/extend", {"receipts": [earlier], "visibility_ms": 3_600_000})
    assert (status, body["extended"], body["stale_receipts"]) == (200, 0, [earlier]), body
    assert replies == {("delay_extend", "0")}
    assert redis_client.zscore(keys.delay_taken(queue), "e1") == deadline  # not pushed out
    with produced() as replies:  # the current delivery's receipt extends
        status, body = api("POST", f"/delay-queues/{queue}/extend", {"receipts": [current], "visibility_ms": 60_000})
    assert (status, body["extended"], body["stale_receipts"]) == (200, 1, []), body
    assert replies == {("delay_extend", "1")}
    assert api("POST", f"/delay-queues/{queue}/ack", {"receipts": [current]})[1]["acknowledged"] == 1
    with produced() as replies:  # acknowledged: the receipt is no delivery's any more
        status, body = api("POST", f"/delay-queues/{queue}/extend", {"receipts": [current], "visibility_ms": 3_600_000})
    assert (status, body["extended"], body["stale_receipts"]) == (200, 0, [current]), body
    assert replies == {("delay_extend", "0")}
    assert redis_client.zscore(keys.delay_taken(queue), "e1") is None


def test_a_retry_with_a_receipt_no_longer_current_changes_nothing(monkeypatch):
    from hotledger.dal.delay_queue import RetryOutcome
    from hotledger.runtime import delay_queue

    dq, queue = delay_queue(), _queue()
    monkeypatch.setattr(dq, "max_deliveries", 2)
    monkeypatch.setattr(dq, "retry_base_ms", 0)
    monkeypatch.setattr(dq, "retry_cap_ms", 0)
    dq.offer(queue, "e1", due_at_ms=0)
    first = dq.drain(queue, int(time.time() * 1000), 1).deliveries[0]
    with produced() as replies:
        assert dq.retry(queue, [first.receipt]) == [RetryOutcome.RETRY]
    assert replies == {("delay_retry", "1")}
    second = dq.drain(queue, int(time.time() * 1000) + 1, 1).deliveries[0]  # handed out again after the backoff
    assert second.deliveries == 2
    with produced() as replies:  # the first delivery's receipt: no longer current
        assert dq.retry(queue, [first.receipt]) == [RetryOutcome.STALE]
    assert replies == {("delay_retry", "0")}
    assert not dq.dead_letters(queue)  # nothing changed: neither retried again nor dead-lettered
    with produced() as replies:  # the second delivery failed too: the most deliveries, a dead letter
        assert dq.retry(queue, [second.receipt]) == [RetryOutcome.DEAD]
    assert replies == {("delay_retry", "2")}
    assert [d.element for d in dq.dead_letters(queue)] == ["e1"]


def test_a_journey_started_again_while_its_reminder_was_posted_is_kept_for_its_own(api, monkeypatch):
    """The scan reads a journey's start, posts its reminder, then drops it only if the start is still the one it read
    (journey_done: a compare-and-set). A finish and a new start in between win: the new start stays."""
    from hotledger.notices.feature import journeys

    account, biz = api.account(), "password-recovery"
    scan = journeys()
    monkeypatch.setattr(scan, "thresholds", {biz: 0})
    started = int(time.time() * 1000) - 1000
    assert scan.start(biz, account, started) == started
    post = scan.inbox.post

    def restarted_meanwhile(to, *args, **kwargs):
        if to == account:
            assert scan.finish(biz, account)
            scan.start(biz, account, started + 500)
        return post(to, *args, **kwargs)

    monkeypatch.setattr(scan.inbox, "post", restarted_meanwhile)
    with produced() as replies:
        scan.scan(int(time.time() * 1000))
    assert ("journey_done", "0") in replies
    assert scan.store.started_before(biz, started + 500, 10**6).count((account, started + 500)) == 1
    monkeypatch.setattr(scan.inbox, "post", post)
    with produced() as replies:  # the next scan reminds the new start and drops it
        scan.scan(int(time.time() * 1000))
    assert ("journey_done", "1") in replies
    assert (account, started + 500) not in scan.store.started_before(biz, started + 500, 10**6)


def test_a_rebuild_that_finds_the_vouchers_buckets_live_changes_nothing(api, redis_client):
    from hotledger.vouchers.feature import vouchers

    voucher_id = voucher(api, stock=5)
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": api.account()})[0] == 200
    before = redis_client.hgetall(keys.voucher(voucher_id))
    with produced() as replies:
        vouchers().rebuild(voucher_id)  # raced by the live bucket: loaded already
    assert replies == {("voucher_load", "0")}
    assert redis_client.hgetall(keys.voucher(voucher_id)) == before  # no hold, no stock change
    assert api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": api.account()})[0] == 200


def test_a_rebuild_that_finds_the_packet_live_changes_nothing(api, redis_client):
    """A red packet's rebuild raced by the live packet (a grab loaded it first): redpacket_load answers 0 and leaves
    the packet as it is, no hold set over a packet Redis never lost."""
    from hotledger.redpackets.feature import redpackets

    sender = api.account(balance="10.00")
    status, packet = api("POST", "/redpackets", {"sender_id": sender, "total": "2.00", "count": 2})
    assert status == 201, packet
    packet_id = int(packet["packet_id"])
    before = redis_client.hgetall(keys.packet(packet_id))
    with produced() as replies:
        redpackets().rebuild(packet_id)
    assert replies == {("redpacket_load", "0")}
    assert redis_client.hgetall(keys.packet(packet_id)) == before
    assert api("POST", f"/redpackets/{packet_id}/grab", {"user_id": api.account()})[0] == 200
