"""Every event a Lua script XADDs (the Redis Streams transport) is the event outbox/events.py decodes: each script
that emits one runs here through the API (or the delay drainer, for an expiry), and each event it wrote is validated
against its pydantic model, with no field the model does not know; a ledger event is the one ledger/entry.py's
Entry.event builds from the entry string the same script stored (the reconciler's path when an event is lost)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from helpers import voucher
from hotledger import keys
from hotledger.dal.redis_store import script_text
from hotledger.ledger.entry import Entry
from hotledger.ledger.kinds import KINDS
from hotledger.outbox.events import EVENT_ADAPTER, LedgerEvent, RedPacketClaimEvent, VoucherOrderEvent
from hotledger.vouchers.rows import home_bucket
from tests.integration.test_holds import _drain
from tests.integration.test_streams import drain_once, stream_mode  # noqa: F401 (the fixture)

REPO = Path(__file__).resolve().parents[2]
# texts a script must escape, and ';' that the entry string separates its fields with
AWKWARD_TEXT = 'for "bob"; 50% off / \\ é'


def _collect(redis_client, user_id: int, seen: dict[bytes, tuple[bytes, str | None]]) -> None:
    """Each stream entry not seen yet: its event, and for a ledger event of the user the entry string stored with it
    (read now: the drain acknowledges and deletes the entry, and settling marks the string)."""
    for shard in range(2):
        for stream_id, fields in redis_client.xrange(keys.stream(shard)):
            if b"e" not in fields or stream_id in seen:
                continue
            event = json.loads(fields[b"e"])
            stored = None
            if event["type"] == "ledger" and event["user_id"] == user_id:
                stored = redis_client.get(keys.entry(user_id, event["id"])).decode()
            seen[stream_id] = (fields[b"e"], stored)


def test_every_scripts_event_is_its_model_and_a_ledger_event_is_its_entry_strings(
    stream_mode,  # noqa: F811
    api,
    redis_client,
):
    # ledger_apply (R, D under an Idempotency-Key, a granted R and a D spending grants, an operator's adjustment A and
    # N, a transfer's debit T beside live grants), hold_change (H, C, V and an X by the delay drainer), ledger_refund (F), ledger_grant_expire (G by the delay
    # drainer)
    user_id = api.account(balance="50.00")
    status, order = api("POST", f"/accounts/{user_id}/deduct", {"amount": "5.00"}, {"Idempotency-Key": "evt-1"})
    assert status == 200, order
    for amount in ("1.00", "-1.00"):
        status, body = api("POST", f"/ops/accounts/{user_id}/adjustments", {"amount": amount, "reason": AWKWARD_TEXT})
        assert status == 200, body
    now_ms = int(time.time() * 1000)
    for amount, expires_at in (("3.00", now_ms + 1_000), ("2.00", now_ms + 600_000)):
        status, body = api(
            "POST",
            f"/accounts/{user_id}/recharge",
            {"amount": amount, "grant": {"expires_at": expires_at, "category": "promo"}},
        )
        assert status == 200, body
    status, body = api("POST", "/transfers", {"from": user_id, "to": api.account(), "amount": "1.00"})
    assert status == 201, body
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert status == 200, body
    status, hold = api("POST", f"/accounts/{user_id}/holds", {"amount": "10.00", "description": AWKWARD_TEXT})
    assert status == 201, hold
    status, body = api("POST", f"/accounts/{user_id}/holds/{hold['hold_id']}/capture", {"amount": "0.50"})
    assert status == 200, body
    status, body = api("POST", f"/accounts/{user_id}/holds/{hold['hold_id']}/void")
    assert status == 200, body
    status, expiring = api("POST", f"/accounts/{user_id}/holds", {"amount": "1.00", "expires_in_s": 1})
    assert status == 201, expiring
    seen: dict[bytes, tuple[bytes, str | None]] = {}
    _collect(redis_client, user_id, seen)
    drain_once(stream_mode)  # a refund names a booked charge only
    status, body = api(
        "POST", f"/accounts/{user_id}/orders/{order['order_id']}/refunds", {"amount": "2.00", "reason": AWKWARD_TEXT}
    )
    assert status == 201, body
    time.sleep(1.05)
    _drain()
    # voucher_order (a unit at home) and voucher_take (the next buyer's unit from the other bucket)
    voucher_id = voucher(api, stock=2, stock_shards=2)
    buyers = [u for u in range(7_000_000, 7_000_100) if home_bucket(u, 2) == 0][:2]
    for buyer in buyers:
        status, body = api("POST", f"/vouchers/{voucher_id}/orders", {"user_id": buyer})
        assert status == 200, body
    # redpacket_grab
    status, packet = api("POST", "/redpackets", {"sender_id": user_id, "total": "2.00", "count": 2})
    assert status == 201, packet
    status, body = api("POST", f"/redpackets/{packet['packet_id']}/grab", {"user_id": api.account()})
    assert status == 200, body

    _collect(redis_client, user_id, seen)
    ledger, orders, claims = [], [], []
    for raw, stored in seen.values():
        event = EVENT_ADAPTER.validate_json(raw)
        assert set(json.loads(raw)) <= set(type(event).model_fields), raw  # no field the model would drop unread
        if isinstance(event, LedgerEvent) and event.user_id == user_id:
            ledger.append((event, raw, stored))
        elif isinstance(event, VoucherOrderEvent) and event.voucher_id == voucher_id:
            orders.append(event)
        elif isinstance(event, RedPacketClaimEvent) and event.packet_id == int(packet["packet_id"]):
            claims.append(event)
    assert {event.kind for event, _, _ in ledger} == set(KINDS), "every kind of entry is emitted here"
    for event, raw, stored in ledger:
        assert Entry.parse(user_id, event.id, stored).event() == json.loads(raw), stored
    assert {e.description for e, _, _ in ledger if e.kind == "H"} >= {AWKWARD_TEXT}
    assert {e.reason for e, _, _ in ledger if e.kind == "F"} == {AWKWARD_TEXT}
    granted = [e for e, _, _ in ledger if e.kind == "R" and e.grant_expires_at is not None]
    assert sorted((e.amount, e.grant_category) for e in granted) == [(200, "promo"), (300, "promo")]
    soonest = min(granted, key=lambda e: e.grant_expires_at or 0)
    # the 1.00 deduct spent the sooner grant first (the red packet's, later, the other: the sooner one had expired)
    assert f"{soonest.id}:100" in {e.grants_spent for e, _, _ in ledger if e.kind == "D"}
    assert [e.grants_spent for e, _, _ in ledger if e.kind == "T"] == [None]  # plain money only
    # the capture spent the sooner grant too (0.50 of it); its expiry took the rest
    assert [e.grants_spent for e, _, _ in ledger if e.kind == "C"] == [f"{soonest.id}:50"]
    assert [(e.grant_id, e.amount) for e, _, _ in ledger if e.kind == "G"] == [(soonest.id, 150)]
    assert sorted((o.user_id, o.bucket, o.home) for o in orders) == [(buyers[0], 0, 0), (buyers[1], 1, 0)]
    assert len(claims) == 1
    drain_once(stream_mode)  # the next test starts from an empty stream (test_streams counts its length)


def test_lib_entry_reads_back_every_kinds_entry_string_as_written(redis_client, tmp_path):
    """entry_fields and entry_string are each other's inverse for every kind, a text with ';' in it included, and a
    'settled;' string reads as the entry it marks; Entry.parse reads the same fields."""
    (tmp_path / "lib").symlink_to(REPO / "layers/lua/lib")
    (tmp_path / "probe.lua").write_text(
        "--! include entry\nlocal e = entry_fields(ARGV[1])\n"
        "return {entry_string(e), e.kind, e.description or e.reason or '', e.captured_after or ''}\n"
    )
    probe = redis_client.register_script(script_text(tmp_path / "probe.lua"))
    hold = "500;7;900;3;{kind};e1;1;;11;0;99;400;ACTIVE"
    strings = {
        "D": "500;7;900;3;D;e1;BALANCE;c:key-1",
        "D spending grants": "500;7;900;3;D;e1;BALANCE;;11:300,12:200",
        "T": "500;7;900;3;T;e1;1;transferdebit9",
        "R": "500;7;900;3;R;e1;1;",
        "R granted": "500;7;900;3;R;e1;1;;99;promo",
        "G": "500;7;900;3;G;e1;1;;11;99;promo",
        "A": "500;7;900;3;A;e1;1;c:adj-1",
        "N": "500;7;900;3;N;e1;BALANCE;;11:200",
        "F": f"500;7;900;3;F;e1;1;;42;order;500;;{AWKWARD_TEXT}",
        "F giving back to grants": f"500;7;900;3;F;e1;1;;42;order;500;11:300;{AWKWARD_TEXT}",
        "H": hold.format(kind="H") + f";{AWKWARD_TEXT}",
        "C": hold.format(kind="C") + ";;200",
        "C spending grants": hold.format(kind="C") + ";;200;11:300,12:200",
        "V": hold.format(kind="V") + ";;200",
        "X": hold.format(kind="X") + ";;200",
    }
    assert {name.split()[0] for name in strings} == set(KINDS)
    for name, stored in strings.items():
        kind = name.split()[0]
        text = AWKWARD_TEXT if kind in ("F", "H") else ""
        captured = "200" if kind in ("C", "V", "X") else ""
        for raw in (stored, "settled;" + stored):
            assert [v.decode() for v in probe(args=[raw])] == [stored, kind, text, captured]
        entry = Entry.parse(7, 1, stored)
        assert entry.kind == kind
        if text:
            assert text in (entry.hold and entry.hold.description, entry.refund and entry.refund.reason)
        if kind == "F":
            assert entry.refund is not None and entry.refund.grants_refunded == ("11:300" if "grants" in name else "")
        if kind == "C":
            assert (entry.hold and entry.hold.captured_after, entry.grant) == (
                200,
                "11:300,12:200" if name.endswith("grants") else None,
            )
