"""Credit grants' registration (hotledger.features): the delay queue that ends grants at their expires_at. Their
routes are the accounts' (a recharge's `grant`, GET /accounts/{id}'s `grants`: ledger/routes.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotledger.features import Feature


def _delay_handlers() -> dict[str, Callable[[list[str]], Any]]:
    from hotledger import runtime
    from hotledger.grants.service import GRANT_EXPIRY

    return {GRANT_EXPIRY: runtime.grants().expire_due}


FEATURE = Feature(name="grants", delay_handlers=_delay_handlers)
