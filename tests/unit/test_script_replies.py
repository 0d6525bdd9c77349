"""dal/script_reply.py: each reply class states its shape (FIELDS), one parser reads every script's reply."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest

import hotledger
from hotledger.dal.script_reply import ScriptReply, _converter
from hotledger.ledger.replies import ApplyReply, ApplyStatus, RollbackReply, RollbackStatus
from hotledger.vouchers.replies import OrderReply, OrderStatus, ReconcileReply, ReconcileStatus


def _reply_classes() -> list[type[ScriptReply]]:
    for module in pkgutil.walk_packages(hotledger.__path__, "hotledger."):
        if module.name.endswith((".replies", ".store", ".lock")):
            importlib.import_module(module.name)
    return sorted(ScriptReply.__subclasses__(), key=lambda cls: cls.__qualname__)


def test_the_reply_classes_are_found():
    assert {"ApplyReply", "HoldReply", "GrabReply", "RefundReply", "OrderReply", "AcquireReply"} <= {
        cls.__name__ for cls in _reply_classes()
    }


@pytest.mark.parametrize("cls", _reply_classes(), ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_each_reply_class_states_a_shape_its_fields_can_read(cls):
    """A typo in FIELDS, a status of another Enum or a field of a type no text converts to fails here, not at the
    first reply of that status."""
    fields = dataclasses.fields(cls)
    assert fields[0].name == "status", f"{cls.__name__}: the status comes first"
    status_type = fields[0].type
    shapes = [cls.FIELDS, *([cls.TAKE_FIELDS] if cls is OrderReply else [])]
    for shape in shapes:
        for status, names in shape.items():
            assert type(status).__name__ == status_type, f"{cls.__name__}: {status} is no {status_type}"
            for name in filter(None, names):
                _converter(cls, name)  # raises for an unknown field or one of an unreadable type


def test_values_convert_by_their_fields_type():
    assert ApplyReply.parse([b"ok", 12, b"900", b"3", b"e1", b"1"]) == ApplyReply(ApplyStatus.OK, 12, 900, 3, "e1", "1")
    assert ApplyReply.parse(["replay", "12", "900", "3", "done"]).done
    assert not ApplyReply.parse(["replay", "12", "900", "3", "pending"]).done
    assert ApplyReply.parse([b"conflict"]) == ApplyReply(ApplyStatus.CONFLICT)
    assert RollbackReply.parse([b"rolled_back"]) == RollbackReply(RollbackStatus.ROLLED_BACK)
    assert RollbackReply.parse([b"rolled_back", 5, 6]) == RollbackReply(RollbackStatus.ROLLED_BACK, 5, 6)


def test_a_value_not_kept_a_rest_taken_a_field_filled_twice_and_another_scripts_shape():
    assert OrderReply.parse([b"ok", 2, b"e", 99, 3]) == OrderReply(OrderStatus.OK, seq=2, epoch="e", bucket=3)
    assert OrderReply.parse([b"away", 2, 4, 1]) == OrderReply(OrderStatus.AWAY, seq=2, probes=(4, 1))
    assert OrderReply.parse([b"already", 1]) == OrderReply(OrderStatus.ALREADY)
    assert ReconcileReply.parse([b"same", 7]) == ReconcileReply(ReconcileStatus.SAME, 7, 7)
    assert ReconcileReply.parse([b"corrected", 7, 5]) == ReconcileReply(ReconcileStatus.CORRECTED, 7, 5)
    assert OrderReply.parse_take([b"ok", b"e"], seq=4, bucket=2) == OrderReply(OrderStatus.OK, 4, "e", bucket=2)
    assert OrderReply.parse_take([b"held", b"99"], seq=4, bucket=2) == OrderReply(OrderStatus.HELD, at="99", bucket=2)


# every reply ledger_apply's header names (layers/lua/ledger_apply.lua), as redis-py gives them: bytes, a Lua number
# as an int, a nil inside the array as None, and replies cut short or longer than their shape
APPLY_REPLIES = [
    [b"missing"],
    [b"sync"],
    [b"unknown_key"],
    [b"recovering", b"1700000000000"],
    [b"held", 1700000000000],
    [b"closed", b"0", b"7"],
    [b"insufficient", b"100", b"8"],
    [b"limit", b"99", b"9"],
    [b"too_many_pending"],
    [b"too_many_keys"],
    [b"conflict"],
    [b"in_progress"],
    [b"replay", b"55", b"900", b"3", b"done"],
    [b"replay", b"55", b"900", b"3", b"pending"],
    [b"ok", b"12", b"900", b"3", b"e1", b"1", b""],
    [b"ok", b"12", b"0", b"4", b"e1", b"BALANCE", b"31:100,32:5"],
    [b"ok", 12, 900, 3, b"e1", b"ADMIN", b"1700000000000;promo"],
    [b"ok", b"12", b"900", b"3", 17, b"1", b""],
    [b"ok", b"12", b"900", b"3", None, b"1", b""],
    [b"ok", b"12", b"900", b"3", b"e1", b"1"],
    [b"ok", b"12", b"900", b"3", b"e1", b"1", b"", b"more"],
    ["ok", "12", "900", "3", "e1", "1", ""],
]


@pytest.mark.parametrize("raw", APPLY_REPLIES, ids=repr)
def test_ledger_applys_replies_read_as_the_general_parser_reads_them(raw):
    assert ApplyReply.parse(raw) == ScriptReply.parse.__func__(ApplyReply, raw)  # type: ignore[attr-defined]


def test_a_reply_ledger_apply_does_not_name_fails_as_the_general_parser_fails():
    for raw in ([b"nonsense"], [b"ok", None, b"1", b"1", b"e", b"1", b""]):
        with pytest.raises(Exception) as general:
            ScriptReply.parse.__func__(ApplyReply, raw)  # type: ignore[attr-defined]
        with pytest.raises(type(general.value)):
            ApplyReply.parse(raw)
