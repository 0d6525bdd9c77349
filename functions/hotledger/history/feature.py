"""The history's registration (hotledger.features) and service: read routes only; the ledger books what it reads."""

from __future__ import annotations

from hotledger.features import Feature
from hotledger.history.service import History
from hotledger.history.store import HistoryStore
from hotledger.ledger.feature import ledger
from hotledger.runtime import service


@service
def history() -> History:
    return History(HistoryStore(), ledger().pending_entries, ledger().account_exists)


FEATURE = Feature(name="history", routes="hotledger.history.routes")
