"""The ledger's registration (hotledger.features): accounts and their charges."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hotledger.features import Feature, PartContext, ReconcilePart


def _persisters() -> dict[type, Any]:
    from hotledger import runtime
    from hotledger.outbox.events import LedgerEvent

    return {LedgerEvent: runtime.ledger_persister()}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    reconcile = runtime.ledger_reconcile()

    def accounts(run: PartContext) -> int:
        done = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)
        for name, value in asdict(done).items():
            setattr(run.report, name, value)
        return done.next_after

    return (ReconcilePart(name="accounts", run=accounts),)


FEATURE = Feature(
    name="ledger", routes="hotledger.ledger.routes", persisters=_persisters, reconcile_parts=_reconcile_parts
)
