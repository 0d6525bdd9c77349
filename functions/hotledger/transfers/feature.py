"""Transfers' registration (hotledger.features)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.features import Feature, PartContext, ReconcilePart


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    def transfers(run: PartContext) -> None:
        run.report.transfers = runtime.transfer_reconciler().run(run.now_ms, run.age_s)

    return (ReconcilePart(name="transfers", run=transfers),)


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    from hotledger import runtime
    from hotledger.transfers.service import TRANSFER_POST

    return {TRANSFER_POST: runtime.transfers().look_again_due}


FEATURE = Feature(
    name="transfers",
    routes="hotledger.transfers.routes",
    reconcile_parts=_reconcile_parts,
    delay_handlers=_delay_handlers,
)
