"""Transfers' registration (hotledger.features) and services."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.config import settings
from hotledger.features import Feature
from hotledger.ledger.feature import ledger
from hotledger.reconciler import PartContext, ReconcilePart
from hotledger.runtime import currencies, delay_queue, id_generator, service
from hotledger.transfers.reconcile import TransferReconciler
from hotledger.transfers.service import TRANSFER_POST, Transfers
from hotledger.transfers.store import TransferStore


@service
def transfers() -> Transfers:
    return Transfers(
        TransferStore(), ledger(), currencies(), delay_queue(), id_generator().next_id, settings().idempotency_lease_ms
    )


@service
def transfer_reconciler() -> TransferReconciler:
    return TransferReconciler(transfers(), TransferStore())


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    def transfers_part(run: PartContext) -> None:
        run.report.transfers = transfer_reconciler().run(run.now_ms, run.age_s)

    return (ReconcilePart(name="transfers", run=transfers_part),)


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    return {TRANSFER_POST: transfers().look_again_due}


FEATURE = Feature(
    name="transfers",
    routes="hotledger.transfers.routes",
    reconcile_parts=_reconcile_parts,
    delay_handlers=_delay_handlers,
)
