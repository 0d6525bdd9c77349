"""Refunds' registration (hotledger.features) and service: routes only; the ledger books refunds (kind F) with every
entry."""

from __future__ import annotations

from hotledger.config import settings
from hotledger.dal.redis_store import lua, stream_flag
from hotledger.features import Feature
from hotledger.holds.feature import holds
from hotledger.ledger.feature import ledger
from hotledger.ledger.rows import MAX_BALANCE
from hotledger.refunds.service import Refunds
from hotledger.refunds.store import RefundStore
from hotledger.runtime import durability, id_generator, service


@service
def refunds() -> Refunds:
    cfg = settings()
    return Refunds(
        RefundStore(lua(), stream_flag(cfg), cfg.entry_ttl_s, MAX_BALANCE),
        durability(),
        ledger(),
        holds(),
        id_generator().next_id,
    )


FEATURE = Feature(name="refunds", routes="hotledger.refunds.routes")
