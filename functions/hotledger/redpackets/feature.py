"""Red packets' registration (hotledger.features)."""

from __future__ import annotations

from hotledger.features import Feature, ReconcilePart


def _persisters() -> dict:
    from hotledger import runtime
    from hotledger.outbox.events import RedPacketClaimEvent

    return {RedPacketClaimEvent: runtime.redpacket_persister()}


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    from hotledger import runtime

    reconcile = runtime.packet_reconciler()

    def packets(run):
        run.report.packets = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)
        return run.report.packets.next_after

    return (ReconcilePart(name="packets", run=packets),)


def _delay_handlers() -> dict:
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
