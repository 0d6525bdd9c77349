"""ledger.book: the DB's numbering of an account's entries (issue 20, one ledger model)."""

from hotledger.history.service import Filters, decode_cursor, encode_cursor
from hotledger.ledger.book import book, type_and_ref
from hotledger.ledger.entry import LedgerHead
from hotledger.outbox.events import LedgerEvent


def event(entry_id, user_id, kind, amount, version, key=None):
    return LedgerEvent(
        type="ledger",
        id=entry_id,
        kind=kind,
        user_id=user_id,
        amount=amount,
        balance_after=0,
        version=version,
        epoch="e",
        ts=1_000,
        open="1",
        idem_key=key,
    )


def test_entries_are_booked_in_version_order_after_the_head_gapless_with_running_balances():
    heads = {7: LedgerHead(seq=4, balance=1_000, on_hold=100, booked_at=5_000), 8: LedgerHead(0, 0, 0, 0)}
    changes = [event(12, 7, "D", 300, 9), event(11, 7, "R", 50, 8), event(13, 8, "R", 70, 1), event(14, 9, "R", 1, 1)]
    rows, moved = book(changes, heads, now_ms=4_000)  # the clock behind the last booking: booked_at does not go back
    assert [(r.user_id, r.seq, r.entry_id, r.delta, r.balance_after, r.available_after, r.booked_at) for r in rows] == [
        (7, 5, 11, 50, 1_050, 950, 5_000),
        (7, 6, 12, -300, 750, 650, 5_000),
        (8, 1, 13, 70, 70, 70, 4_000),
    ]
    assert moved == {7: LedgerHead(6, 750, 100, 5_000), 8: LedgerHead(1, 70, 0, 4_000)}  # 9 has no account: left out


def test_each_change_names_its_type_and_what_caused_it():
    assert type_and_ref("D", "c:abc") == ("deduct", "key:abc")
    assert type_and_ref("R", None) == ("recharge", None)
    assert type_and_ref("D", "payorder5") == ("payment_charge", "payment_order:5")
    assert type_and_ref("R", "payorderrefund5") == ("payment_refund", "payment_order:5")
    assert type_and_ref("D", "rp9") == ("redpacket_debit", "redpacket:9")
    assert type_and_ref("R", "rp10") == ("redpacket_credit", "redpacket_item:10")
    assert type_and_ref("R", "rprefund9") == ("redpacket_refund", "redpacket:9")


def test_a_cursor_carries_its_account_and_filters():
    filters = Filters(("deduct", "recharge"), 5, 10)
    assert decode_cursor(3, encode_cursor(3, 42, filters)) == (42, filters)
