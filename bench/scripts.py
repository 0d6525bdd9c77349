"""The ledger scripts as the bench calls them directly (without the handler): through the product's typed wrappers
(hotledger.ledger.store.LedgerStore), never with a copy of a script's KEYS and ARGV here, so a script's new argument
is the wrapper's to pass and the bench cannot drift from it. Where a stage needs the raw call (redis-benchmark's
command line, pipelines of thousands), `recorded` captures the keys and arguments the wrapper would send."""

from __future__ import annotations

import functools
import time
from typing import Any

from hotledger.config import settings
from hotledger.dal.redis_store import Lua
from hotledger.features import tell_booked
from hotledger.ledger.rows import AccountRow, Charge
from hotledger.ledger.store import LedgerStore

KIND_DEDUCT = "D"
EPOCH = "bench"


def store(lua: Lua) -> LedgerStore:
    """The product's ledger store over this script runner (the run's settings)."""
    return LedgerStore(lua, settings(), tell_booked)


def account(user_id: int, balance: int, mode: str = "ASYNC") -> AccountRow:
    """An open account of this balance as the DB would hold it (version 1, no threshold, nothing on hold)."""
    return AccountRow(user_id, f"bench-{user_id}", mode, balance, 1, 0, 0, 0, 0, "1")


def load(lua: Lua, user_id: int, balance: int, mode: str = "ASYNC") -> bool:
    """Cache an account in Redis as a load from the DB does (ledger_load through LedgerStore.cache_account): no
    rebuild hold, no holds. False when it was cached already."""
    return store(lua).cache_account(account(user_id, balance, mode), balance, EPOCH, {})


def deduct(user_id: int, entry_id: int, amount: int = 1, ts: int | None = None) -> Charge:
    """An ASYNC deduct without an Idempotency-Key, as LedgerStore.apply takes it."""
    return Charge(KIND_DEDUCT, user_id, amount, entry_id, int(time.time() * 1000) if ts is None else ts, None, "")


class _Recorded(Exception):
    def __init__(self, call: tuple[str, list[str], list[Any]]):
        super().__init__(call[0])
        self.call = call


class _Recorder:
    """A stand-in for Lua whose run records the script call instead of sending it."""

    def __init__(self, lua: Lua):
        self.client = lua.client

    def run(self, name: str, keys: list[str], args: list[Any], client: Any = None) -> Any:
        raise _Recorded((name, list(keys), list(args)))


@functools.lru_cache(maxsize=8)
def _recording_store(lua: Lua) -> LedgerStore:
    return LedgerStore(_Recorder(lua), settings(), tell_booked)  # type: ignore[arg-type]


def recorded(lua: Lua, method: str, *args: Any, **kwargs: Any) -> tuple[str, list[str], list[Any]]:
    """(script name, KEYS, ARGV) that LedgerStore.<method>(*args, **kwargs) sends, without sending it: the call a
    pipeline or redis-benchmark then makes as the product would."""
    try:
        getattr(_recording_store(lua), method)(*args, **kwargs)
    except _Recorded as done:
        return done.call
    raise RuntimeError(f"LedgerStore.{method} ran no script")


def load_call(lua: Lua, user_id: int, balance: int, mode: str = "ASYNC") -> tuple[str, list[str], list[Any]]:
    """load's script call, for a pipeline."""
    return recorded(lua, "cache_account", account(user_id, balance, mode), balance, EPOCH, {})


def deduct_call(lua: Lua, user_id: int, entry_id: int, amount: int = 1) -> tuple[str, list[str], list[Any]]:
    """An ASYNC deduct's ledger_apply call (LedgerStore.apply), for a pipeline or a command line."""
    return recorded(lua, "apply", deduct(user_id, entry_id, amount))
