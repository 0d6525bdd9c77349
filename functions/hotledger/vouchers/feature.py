"""Flash-sale vouchers' registration (hotledger.features)."""

from __future__ import annotations

from typing import Any

from hotledger.features import Feature, PartContext, ReconcilePart


def _persisters() -> dict[type, Any]:
    from hotledger import runtime
    from hotledger.outbox.events import VoucherOrderEvent

    return {VoucherOrderEvent: runtime.voucher_persister()}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    reconcile = runtime.voucher_reconciler()

    def vouchers(run: PartContext) -> int:
        run.report.vouchers = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)
        return run.report.vouchers.next_after

    return (ReconcilePart(name="vouchers", run=vouchers),)


FEATURE = Feature(
    name="vouchers", routes="hotledger.vouchers.routes", persisters=_persisters, reconcile_parts=_reconcile_parts
)
