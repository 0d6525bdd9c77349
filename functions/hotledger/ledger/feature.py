"""The ledger's registration (hotledger.features) and services: accounts and their charges. Every booking is handed
to the registered features' subscribers (features.tell_booked) inside its transaction."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hotledger.config import settings
from hotledger.dal.redis_store import lua
from hotledger.features import Feature, tell_booked
from hotledger.ledger.persist import LedgerPersister
from hotledger.ledger.reconcile import LedgerReconcile
from hotledger.ledger.service import Ledger
from hotledger.ledger.store import LedgerStore
from hotledger.outbox.events import LedgerEvent
from hotledger.reconciler import PartContext, ReconcilePart
from hotledger.runtime import durability, id_generator, lock, log_hold, outbox, service


@service
def ledger_store() -> LedgerStore:
    return LedgerStore(lua(), settings(), tell_booked)


@service
def ledger() -> Ledger:
    next_id = id_generator().next_id
    return Ledger(ledger_store(), durability(), lock(), next_id, log_hold(), settings().rebuild_hold_ms)


@service
def ledger_persister() -> LedgerPersister:
    return LedgerPersister(ledger_store(), outbox())


@service
def ledger_reconcile() -> LedgerReconcile:
    cfg = settings()
    return LedgerReconcile(ledger_store(), ledger_persister(), cfg.reconcile_page, cfg.reconcile_pending_limit)


def _persisters() -> dict[type, Any]:
    return {LedgerEvent: ledger_persister()}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    reconcile = ledger_reconcile()

    def accounts(run: PartContext) -> int:
        done = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)
        for name, value in asdict(done).items():
            setattr(run.report, name, value)
        return done.next_after

    return (ReconcilePart(name="accounts", run=accounts),)


FEATURE = Feature(
    name="ledger", routes="hotledger.ledger.routes", persisters=_persisters, reconcile_parts=_reconcile_parts
)
