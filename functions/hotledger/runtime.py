"""What every feature shares, built once per Lambda container: the settings, Redis, ids, the publisher's durability,
locks, the delay queue, the outbox; and what gathers every registered feature (hotledger.features): the writer, the
reconciler and the delay drainer. A feature's own services are built in its feature.py, each with `service`; this
module imports no feature."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from hotledger.config import settings
from hotledger.currencies.service import Currencies
from hotledger.currencies.store import CurrencyStore
from hotledger.dal import publisher
from hotledger.dal.cursor import Cursors
from hotledger.dal.delay_queue import DelayQueue, Drainer, Handler
from hotledger.dal.event_keys import EventKeys
from hotledger.dal.idempotency import Idempotency
from hotledger.dal.ids import IdGenerator
from hotledger.dal.lock import DistributedLock
from hotledger.dal.redis_store import lua
from hotledger.features import registered
from hotledger.outbox.durable import Durability
from hotledger.outbox.log_hold import LogHold
from hotledger.outbox.store import EventStreams, OutboxStore
from hotledger.outbox.stream_consumer import StreamConsumer
from hotledger.outbox.writer import Writer
from hotledger.reconciler import Reconciler

T = TypeVar("T")
_services: list[Any] = []  # every factory `service` made, for reset()


def service(factory: Callable[[], T]) -> Callable[[], T]:
    """A process-wide service: built on first use, then the same one (reset() forgets it)."""
    cached = functools.lru_cache(maxsize=1)(factory)
    _services.append(cached)
    return cached


def reset() -> None:
    """Forget every cached service and setting (tests switching configuration), the features' services too."""
    settings.cache_clear()
    lua.cache_clear()
    for cached in _services:
        cached.cache_clear()


@service
def event_keys() -> EventKeys:
    cfg = settings()
    return EventKeys(cfg.event_keys_secret_arn or None, cfg.event_keys or None, cfg.event_keys_max_age_s)


def durability() -> Durability:
    cfg = settings()
    return Durability(cfg, publisher.publish, id_generator().next_id, event_keys())


@service
def id_generator() -> IdGenerator:
    return IdGenerator(lua())


@service
def idempotency() -> Idempotency:
    cfg = settings()
    return Idempotency(lua(), cfg.idempotency_ttl_s, cfg.idempotency_lease_ms, cfg.max_idempotency_keys)


@service
def lock() -> DistributedLock:
    cfg = settings()
    return DistributedLock(lua(), cfg.lock_ttl_ms, cfg.lock_wait_ms)


@service
def currencies() -> Currencies:
    return Currencies(CurrencyStore(lua()), settings().default_currency)


@service
def outbox() -> OutboxStore:
    return OutboxStore(lua(), settings().entry_ttl_s)


@service
def log_hold() -> LogHold:
    cfg = settings()
    return LogHold(outbox(), publisher.end_offsets, cfg.kafka_topic, streamed=cfg.event_transport == "redis-stream")


@service
def delay_queue() -> DelayQueue:
    cfg = settings()
    return DelayQueue(
        lua(),
        cfg.delay_visibility_ms,
        cfg.delay_max_deliveries,
        cfg.delay_retry_base_ms,
        cfg.delay_retry_cap_ms,
        cfg.delay_max_queue_size,
    )


@service
def writer() -> Writer:
    """Every registered feature's persisters, by the event type each persists."""
    return Writer(
        {event_type: persister for feature in registered() for event_type, persister in feature.persisters().items()},
        outbox(),
    )


@service
def reconciler() -> Reconciler:
    """Every registered feature's reconcile parts, in the registry's order."""
    cfg = settings()
    parts = [part for feature in registered() for part in feature.reconcile_parts()]
    return Reconciler(parts, cfg.reconcile_age_s, Cursors(lua().client), cfg.reconcile_part_items, cfg.reconcile_part_s)


def delay_handlers() -> dict[str, Handler]:
    """The queues the scheduled drainer serves (every registered feature's), with their handlers; other queues are
    served over HTTP."""
    return {queue: handle for feature in registered() for queue, handle in feature.delay_handlers().items()}


def delay_drainer() -> Drainer:
    return Drainer(delay_queue(), delay_handlers())


def stream_consumer(name: str) -> StreamConsumer:
    return StreamConsumer(EventStreams(lua().client, settings().stream_group), writer(), settings(), name)
