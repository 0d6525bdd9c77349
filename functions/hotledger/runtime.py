"""Process-wide wiring of the adapters into the domain services (built once per Lambda container)."""
from __future__ import annotations

import functools

from hotledger.config import settings
from hotledger.dal import publisher
from hotledger.dal.lock import AccountLock
from hotledger.dal.redis_store import scripts
from hotledger.ids import IdGenerator
from hotledger.logic.billing import Billing
from hotledger.logic.reconciler import Reconciler
from hotledger.logic.writer import Writer


@functools.lru_cache(maxsize=1)
def id_generator() -> IdGenerator:
    return IdGenerator(scripts().client, scripts().lease)


@functools.lru_cache(maxsize=1)
def billing() -> Billing:
    cfg = settings()
    lock = AccountLock(scripts().client, scripts().lease, cfg.lock_ttl_ms, cfg.lock_wait_ms)
    return Billing(cfg, scripts(), lock, id_generator(), publisher.publish)


@functools.lru_cache(maxsize=1)
def writer() -> Writer:
    return Writer(scripts(), settings().entry_ttl_s)


@functools.lru_cache(maxsize=1)
def reconciler() -> Reconciler:
    return Reconciler(scripts(), writer(), settings().reconcile_age_s)
