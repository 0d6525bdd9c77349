"""The history's registration (hotledger.features): read routes only; the ledger books what it reads."""

from __future__ import annotations

from hotledger.features import Feature

FEATURE = Feature(name="history", routes="hotledger.history.routes")
