"""Flash-sale vouchers' registration (hotledger.features) and services."""

from __future__ import annotations

from typing import Any

from hotledger.config import settings
from hotledger.dal.redis_store import lua, stream_flag
from hotledger.features import Feature
from hotledger.outbox.events import VoucherOrderEvent
from hotledger.reconciler import PartContext, ReconcilePart
from hotledger.runtime import durability, id_generator, log_hold, outbox, service
from hotledger.vouchers.persist import VoucherPersister
from hotledger.vouchers.reconcile import VoucherReconciler
from hotledger.vouchers.service import Vouchers
from hotledger.vouchers.store import VoucherDb, VoucherRedis


@service
def voucher_redis() -> VoucherRedis:
    cfg = settings()
    return VoucherRedis(lua(), stream_flag(cfg), cfg.entry_ttl_s)


@service
def vouchers() -> Vouchers:
    cfg = settings()
    return Vouchers(cfg, VoucherDb(), voucher_redis(), durability(), id_generator().next_id, log_hold())


@service
def voucher_persister() -> VoucherPersister:
    return VoucherPersister(VoucherDb(), voucher_redis(), outbox())


@service
def voucher_reconciler() -> VoucherReconciler:
    return VoucherReconciler(vouchers(), voucher_persister(), VoucherDb(), voucher_redis())


def _persisters() -> dict[type, Any]:
    return {VoucherOrderEvent: voucher_persister()}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    reconcile = voucher_reconciler()

    def vouchers_part(run: PartContext) -> int:
        run.report.vouchers = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)
        return run.report.vouchers.next_after

    return (ReconcilePart(name="vouchers", run=vouchers_part),)


FEATURE = Feature(
    name="vouchers", routes="hotledger.vouchers.routes", persisters=_persisters, reconcile_parts=_reconcile_parts
)
