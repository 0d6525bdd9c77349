"""The account's rulebook (ledger/kinds.py) is the one place a kind of entry is declared: every kind the scripts
write and the migrations store is in it, and what the events and entries do follows from its rows."""

import inspect
import re
from pathlib import Path

import pytest

from hotledger.dal.redis_store import script_text
from hotledger.ledger.entry import Entry
from hotledger.ledger.kinds import ENTRY_TABLES, HOLD_KINDS, KINDS, balance_delta, hold_delta, lua_kinds
from hotledger.ledger.service import after_change, charged_in_db, refused_in_db

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


def test_the_scripts_read_the_kinds_table_generated_from_the_rulebook():
    sets = dict(re.findall(r"^local (KIND_\w+) = '([A-Z]*)'$", lua_kinds(), re.M))
    assert sets == {
        "KIND_DEBITS": "".join(k for k, row in KINDS.items() if row.balance < 0),
        "KIND_WAITS_FOR_DURABLE": "".join(k for k, row in KINDS.items() if row.waits_for_durable),
        "KIND_CHANGES_HOLD": "".join(sorted(HOLD_KINDS, key=list(KINDS).index)),
        "KIND_REFUNDS": "".join(k for k, row in KINDS.items() if row.refunds),
        "KIND_SPENDS_GRANTS": "".join(k for k, row in KINDS.items() if row.spends_grants),
        "KIND_ENDS_GRANT": "".join(k for k, row in KINDS.items() if row.ends_grant),
        "KIND_PLAIN_ONLY": "".join(k for k, row in KINDS.items() if row.plain_only),
    }
    for name in ("ledger_apply", "ledger_rollback"):
        script = script_text(REPO / "layers/lua" / f"{name}.lua")
        assert "local function kind_in(" in script
        # what a change does to the balance is read from KINDS, never from its letter (a hold's change is told
        # apart from another hold's change by letter, inside the branch of the kinds that change a hold)
        branched = set(re.findall(r"kind == '([A-Z])'", script))
        assert not branched - HOLD_KINDS, name


@pytest.mark.parametrize(
    "path", ["ledger/book.py", "ledger/tx.py", "ledger/reconcile.py", "outbox/events.py", "ledger/service.py"]
)
def test_the_ledger_names_no_kind_by_letter_where_it_books_or_charges(path):
    text = (REPO / "functions/hotledger" / path).read_text()
    assert not re.search(r"""kind == ["'][A-Z]["']|Literal\[["'][A-Z]["'],""", text), path
    if path != "ledger/service.py":  # the service's deduct and recharge routes and the orders read name their kind
        assert not re.search(r"KIND_(?:DEDUCT|RECHARGE)\b", text), path


@pytest.mark.parametrize("rule", [after_change, refused_in_db, charged_in_db])
def test_the_rules_of_a_charge_are_read_from_its_kinds_row(rule):
    assert not re.search(r"KIND_[A-Z]+|== ?[\"'][A-Z][\"']", inspect.getsource(rule))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_kinds_entries_are_listed_by_the_history_and_sent_as_its_webhook_event(kind):
    from hotledger.history.service import ENTRY_TYPES
    from hotledger.webhooks.events import EVENT_TYPES, MEANING

    row = KINDS[kind]
    assert row.entry_type in ENTRY_TYPES
    assert row.event and EVENT_TYPES[row.entry_type] == row.event and MEANING[row.event] == row.means
