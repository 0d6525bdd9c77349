"""The account's rulebook (ledger/kinds.py) is the one place a kind of entry is declared: every kind the scripts
write and the migrations store is in it, and what the events and entries do follows from its rows."""

import re
from pathlib import Path

import pytest

from hotledger.ledger.entry import Entry
from hotledger.ledger.kinds import ENTRY_TABLES, HOLD_KINDS, KINDS, balance_delta, hold_delta

REPO = Path(__file__).resolve().parents[2]


def test_every_kind_a_script_writes_is_in_the_rulebook():
    written = set()
    for script in (REPO / "layers/lua").glob("*.lua"):
        written |= set(re.findall(r"(?:op|kind) == '([A-Z])'", script.read_text()))
    assert written and written <= set(KINDS), written - set(KINDS)


def test_every_kinds_table_is_one_the_migrations_create():
    created = set(
        re.findall(
            r"CREATE TABLE IF NOT EXISTS (t_\w+)",
            "".join(p.read_text() for p in (REPO / "infra/migrations").glob("*.sql")),
        )
    )
    assert {table for table, _ in ENTRY_TABLES.values()} <= created


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_entrys_effect_is_its_rows(kind):
    entry = Entry(1, 7, 500, 0, 0, 1, kind, "e", "1")
    assert entry.delta == balance_delta(kind, 500) == KINDS[kind].balance * 500
    assert (kind in HOLD_KINDS) == KINDS[kind].changes_hold


def test_what_holds_keep_moves_as_each_hold_change_says():
    assert hold_delta("H", 500, 0) == 500  # an authorize keeps its amount
    assert hold_delta("C", 200, 0) == -200  # a partial capture takes what it captures
    assert hold_delta("C", 200, 300) == -500  # a final one releases the rest too
    assert hold_delta("V", 300, 300) == hold_delta("X", 300, 300) == -300  # a void or expiry releases the rest
    assert all(hold_delta(k, 500, 0) == 0 for k, row in KINDS.items() if not row.changes_hold)
