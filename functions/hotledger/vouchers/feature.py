"""Flash-sale vouchers' registration (hotledger.features)."""

from __future__ import annotations

from hotledger.features import Feature, ReconcilePart


def _persisters() -> dict:
    from hotledger import runtime
    from hotledger.outbox.events import VoucherOrderEvent

    return {VoucherOrderEvent: runtime.voucher_persister()}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    reconcile = runtime.voucher_reconciler()

    def vouchers(run):
        run.report.vouchers = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)
        return run.report.vouchers.next_after

    return (ReconcilePart(name="vouchers", run=vouchers),)


FEATURE = Feature(
    name="vouchers", routes="hotledger.vouchers.routes", persisters=_persisters, reconcile_parts=_reconcile_parts
)
