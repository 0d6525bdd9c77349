"""Refunds' registration (hotledger.features): routes only; the ledger books refunds (kind F) with every entry."""

from __future__ import annotations

from hotledger.features import Feature

FEATURE = Feature(name="refunds", routes="hotledger.refunds.routes")
