"""Red packets' registration (hotledger.features) and services."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.config import settings
from hotledger.dal.redis_store import lua, stream_flag
from hotledger.features import Feature
from hotledger.ledger.feature import ledger
from hotledger.outbox.events import RedPacketClaimEvent
from hotledger.reconciler import PartContext, ReconcilePart
from hotledger.redpackets.persist import RedPacketPersister
from hotledger.redpackets.reconcile import PacketReconciler
from hotledger.redpackets.service import PACKET_EXPIRY, RedPackets
from hotledger.redpackets.store import PacketCache, PacketStore
from hotledger.runtime import delay_queue, durability, id_generator, log_hold, outbox, service


def packet_cache() -> PacketCache:
    """Stateless: the service and the writer's persister each hold one."""
    cfg = settings()
    return PacketCache(lua(), stream_flag(cfg), cfg.entry_ttl_s, cfg.finished_keys_ttl_s)


@service
def redpackets() -> RedPackets:
    cfg = settings()
    return RedPackets(
        PacketStore(),
        packet_cache(),
        durability(),
        id_generator().next_id,
        ledger(),
        delay_queue(),
        cfg.rebuild_hold_ms,
        log_hold(),
    )


@service
def redpacket_persister() -> RedPacketPersister:
    return RedPacketPersister(PacketStore(), packet_cache(), outbox(), redpackets().credit_grab, redpackets().undo_grab)


@service
def packet_reconciler() -> PacketReconciler:
    return PacketReconciler(redpackets(), redpacket_persister(), PacketStore())


def _persisters() -> dict[type, Any]:
    return {RedPacketClaimEvent: redpacket_persister()}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    reconcile = packet_reconciler()

    def packets(run: PartContext) -> int:
        run.report.packets = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)
        return run.report.packets.next_after

    return (ReconcilePart(name="packets", run=packets),)


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    return {PACKET_EXPIRY: redpackets().expire_due}


FEATURE = Feature(
    name="redpackets",
    routes="hotledger.redpackets.routes",
    persisters=_persisters,
    reconcile_parts=_reconcile_parts,
    delay_handlers=_delay_handlers,
)
