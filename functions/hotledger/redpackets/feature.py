"""Red packets' registration (hotledger.features)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.features import Feature, PartContext, ReconcilePart


def _persisters() -> dict[type, Any]:
    from hotledger import runtime
    from hotledger.outbox.events import RedPacketClaimEvent

    return {RedPacketClaimEvent: runtime.redpacket_persister()}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    reconcile = runtime.packet_reconciler()

    def packets(run: PartContext) -> int:
        run.report.packets = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)
        return run.report.packets.next_after

    return (ReconcilePart(name="packets", run=packets),)


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    from hotledger import runtime
    from hotledger.redpackets.service import PACKET_EXPIRY

    return {PACKET_EXPIRY: runtime.redpackets().expire_due}


FEATURE = Feature(
    name="redpackets",
    routes="hotledger.redpackets.routes",
    persisters=_persisters,
    reconcile_parts=_reconcile_parts,
    delay_handlers=_delay_handlers,
)
