"""One record the DB refuses never stalls a partition: the writer (MSK events) and the reconciler dead-letter it with
the DB's reason and apply the rest exactly once. Real Redis, MariaDB and broker."""

import json

from helpers import invoke_writer, ledger_records, reconcile, records
from hotledger import keys
from hotledger.outbox.events import LedgerEvent, RedPacketClaimEvent
from hotledger.outbox.writer import REJECTED_TOPIC
from hotledger.redpackets.feature import redpackets
from hotledger.runtime import id_generator


def send(api, sender, total="10.00", count=5):
    status, body = api(
        "POST", "/redpackets", {"sender_id": sender, "total": total, "count": count, "expires_in_s": 3600}
    )
    assert status == 201, body
    return int(body["packet_id"])


def grab(api, packet_id, user_id):
    status, body = api("POST", f"/redpackets/{packet_id}/grab", {"user_id": user_id})
    assert status == 200, body
    return int(body["item_id"])


def claim_records(packet_id, first_offset=0):
    claims = sorted(redpackets().pending_claims(packet_id), key=lambda c: c.item_id)
    return records(claims, lambda c: f"rp{c.packet_id}", partition=1, first_offset=first_offset)


def dead_letters(sql, offset):
    return sql("SELECT topic, record_key, error FROM t_dead_letter WHERE offset_no = %s", (offset,))


def test_a_claim_the_db_refuses_for_uk_packet_user_is_dead_lettered_and_the_rest_of_the_batch_persisted_once(
    api, sql, redis_client
):
    """Before: the red packet batch's one UPDATE hit uk_packet_user and the handler raised on every delivery (the
    trigger retries the batch forever: the partition stalls)."""
    sender, alice, bob = api.account(balance="100.00"), api.account(), api.account()
    packet_id = send(api, sender)
    alice_item = grab(api, packet_id, alice)
    invoke_writer(claim_records(packet_id))
    bob_item = grab(api, packet_id, bob)
    (other_item, amount), *_ = sql(
        "SELECT id, amount FROM t_red_packet_item WHERE packet_id = %s AND user_id IS NULL AND id <> %s ORDER BY id",
        (packet_id, bob_item),
    )
    # decodes fine and names a free item of the packet, but alice holds another item of it already
    refused = RedPacketClaimEvent(
        type="redpacket_claim",
        packet_id=packet_id,
        item_id=other_item,
        user_id=alice,
        amount=amount,
        ts=1_700_000_000_000,
        grab_id=id_generator().next_id(),
    )
    batch = (
        records([refused], lambda c: f"rp{c.packet_id}", partition=1, first_offset=900)
        + claim_records(packet_id)
        + ledger_records(redis_client, [sender, alice, bob], first_offset=100)
    )

    for _ in range(2):  # the first delivery, then a re-delivery: it changes nothing
        assert invoke_writer(batch) == {"batchItemFailures": []}
        assert sql(
            "SELECT id, user_id FROM t_red_packet_item WHERE packet_id = %s AND user_id IS NOT NULL ORDER BY id",
            (packet_id,),
        ) == tuple(sorted(((alice_item, alice), (bob_item, bob))))
        ((topic, key, error),) = dead_letters(sql, other_item)
        assert (topic, key) == (REJECTED_TOPIC, f"rp{packet_id}".encode()) and "uk_packet_user" in error
        # the good records of the same batch: bob's claim left Redis's pending hash, every charge is in the DB
        assert redis_client.hlen(keys.packet_pending(packet_id)) == 0
        assert sql("SELECT balance FROM t_account WHERE user_id = %s", (sender,)) == ((9000,),)
        # alice's credit (made after the first batch stamped her claim) is in this batch
        assert sql("SELECT COUNT(*) FROM t_pay WHERE user_id = %s", (alice,)) == ((1,),)
    invoke_writer(ledger_records(redis_client, [bob]))  # bob's, made once after this batch stamped his claim
    assert sql("SELECT COUNT(*) FROM t_pay WHERE user_id = %s", (bob,)) == ((1,),)


def test_an_entry_whose_amount_the_db_cannot_hold_is_dead_lettered_and_the_rest_persisted_once(api, sql, redis_client):
    """Before: the out-of-range value failed the ledger batch's INSERT and the handler raised on every delivery."""
    user_id = api.account(balance="10.00")
    for amount in ("1.00", "2.00"):
        assert api("POST", f"/accounts/{user_id}/deduct", {"amount": amount})[0] == 200
    good = ledger_records(redis_client, [user_id])
    newest = json.loads(good[-1][3])
    too_big = LedgerEvent(
        **{**newest, "id": id_generator().next_id(), "amount": 2**63, "version": newest["version"] + 1}
    )
    batch = good[:2] + records([too_big], lambda e: str(e.user_id), first_offset=50) + good[2:]

    for _ in range(2):
        assert invoke_writer(batch) == {"batchItemFailures": []}
        assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((700,),)
        assert sql("SELECT COUNT(*), SUM(amount) FROM t_order WHERE user_id = %s", (user_id,)) == ((2, 300),)
        ((topic, key, error),) = dead_letters(sql, too_big.id)
        assert (topic, key) == (REJECTED_TOPIC, str(user_id).encode()) and "Out of range" in error
    assert api("GET", f"/accounts/{user_id}")[1]["pending_orders"] == 0


def test_two_copies_of_a_new_entry_in_one_batch_are_one_entry_and_no_dead_letter(api, sql, redis_client):
    user_id = api.account(balance="10.00")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})[0] == 200
    batch = ledger_records(redis_client, [user_id])
    invoke_writer(batch + batch)
    assert sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((1,),)
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((600,),)
    ids = [json.loads(value)["id"] for *_, value in batch]
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE offset_no IN %s", (ids,)) == ((0,),)


def _dead_lettered_in_a_packet_pass(monkeypatch) -> int:
    """Reconciler runs over one whole pass of the open packets, from the first: a run stops where its budget (items
    or seconds) ran out and the next goes on from there (the suite leaves many open packets before this test's), so
    a pass an earlier run left open is finished first and not counted."""
    while reconcile(monkeypatch, age_s=0)["packets"]["next_after"]:
        pass
    dead_lettered = 0
    while True:
        report = reconcile(monkeypatch, age_s=0)["packets"]
        dead_lettered += report["dead_lettered"]
        if not report["next_after"]:
            return dead_lettered


def test_the_reconciler_sets_a_refused_claim_aside_instead_of_failing_every_run(api, sql, redis_client, monkeypatch):
    """Before: the reconciler persisted the stale claim, the DB refused it (uk_packet_user) and every run raised
    there, so nothing after it (other packets, refunds, credits) was ever done."""
    sender, alice = api.account(balance="100.00"), api.account()
    packet_id = send(api, sender)
    first = grab(api, packet_id, alice)
    invoke_writer(claim_records(packet_id))
    redis_client.hdel(keys.packet_grabbers(packet_id), alice)  # a partial loss in Redis: alice may grab again
    second = grab(api, packet_id, alice)
    for _ in range(2):  # a whole pass each time: the first sets the claim aside, the second finds nothing left
        _dead_lettered_in_a_packet_pass(monkeypatch)
        assert "uk_packet_user" in dead_letters(sql, second)[0][2] and len(dead_letters(sql, second)) == 1
        assert sql("SELECT id FROM t_red_packet_item WHERE packet_id = %s AND user_id = %s", (packet_id, alice)) == (
            (first,),
        )
        # settled as refused (issue 19 item 5): no longer pending, its item back among the unclaimed
        assert redis_client.hlen(keys.packet_pending(packet_id)) == 0
        assert api("GET", f"/redpackets/{packet_id}")[1]["remaining"] == 4


def test_a_pending_entry_the_db_refuses_is_settled_as_refused_in_redis(api, sql, redis_client):
    """Issue 19 item 5: an entry charged in Redis that the DB refuses for its data was dead-lettered and stayed
    pending for good (the account's balance in Redis ahead of the DB for ever, its pending count never 0). It is
    recorded rolled back (never persisted later) and given back in Redis, so Redis == DB; the dead letter and the
    WriterDeadLettered alarm show it to operators."""
    user_id = api.account(balance="10.00")
    assert invoke_writer(ledger_records(redis_client, [user_id])) == {"batchItemFailures": []}
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"})[0] == 200
    pending = ledger_records(redis_client, [user_id])
    sql(f"ALTER TABLE t_order ADD CONSTRAINT chk_refuse_{user_id} CHECK (user_id <> {user_id})")
    try:
        assert invoke_writer(pending) == {"batchItemFailures": []}
    finally:
        sql(f"ALTER TABLE t_order DROP CONSTRAINT chk_refuse_{user_id}")
    entry_id = json.loads(pending[0][3])["id"]
    assert dead_letters(sql, entry_id)
    account = api("GET", f"/accounts/{user_id}")[1]
    assert (account["pending_orders"], account["balance"]) == (0, "10.00"), account
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1000,),)
    assert sql("SELECT COUNT(*) FROM t_rolled_back WHERE change_id = %s", (entry_id,)) == ((1,),)
    assert invoke_writer(pending) == {"batchItemFailures": []}  # a re-delivery changes nothing
    assert sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((0,),)


def test_a_pending_claim_the_db_refuses_is_settled_as_refused_in_redis(api, sql, redis_client):
    """Issue 19 item 5, red packets: a claim the DB refuses for its data stayed pending in Redis for good. It is settled
    as refused in its own packet (the item back among the unclaimed, the grab undone, as the DB never took it)."""
    sender, grabber = api.account(balance="10.00"), api.account()
    packet_id = send(api, sender, "2.00", 2)
    item_id = grab(api, packet_id, grabber)
    claims = claim_records(packet_id)
    sql(
        f"ALTER TABLE t_red_packet_item ADD CONSTRAINT chk_refuse_{grabber} CHECK (user_id IS NULL OR user_id <> {grabber})"
    )
    try:
        assert invoke_writer(claims) == {"batchItemFailures": []}
    finally:
        sql(f"ALTER TABLE t_red_packet_item DROP CONSTRAINT chk_refuse_{grabber}")
    assert dead_letters(sql, item_id)
    assert redis_client.hlen(keys.packet_pending(packet_id)) == 0
    view = api("GET", f"/redpackets/{packet_id}")[1]
    assert (view["claimed"], view["remaining"]) == (0, 2), view
    assert sql("SELECT COUNT(*) FROM t_red_packet_item WHERE packet_id = %s AND user_id IS NOT NULL", (packet_id,)) == (
        (0,),
    )
    assert grab(api, packet_id, grabber)  # the grab was undone: the grabber may grab again
