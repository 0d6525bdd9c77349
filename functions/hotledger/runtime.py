"""Process-wide wiring of the adapters into the domain services (built once per Lambda container)."""
from __future__ import annotations

import functools

from hotledger.config import settings
from hotledger.dal import publisher
from hotledger.dal.delay_queue import DelayQueue, Drainer
from hotledger.dal.lock import DistributedLock
from hotledger.dal.redis_store import scripts
from hotledger.ids import IdGenerator
from hotledger.ledger.persist import LedgerPersister
from hotledger.ledger.reconcile import LedgerReconcile
from hotledger.ledger.service import Ledger
from hotledger.ledger.store import LedgerStore
from hotledger.notices.inbox import Inbox
from hotledger.notices.journeys import Journeys, parse_thresholds
from hotledger.notices.payment_orders import (
    ORDER_CLOSES,
    ORDER_REMINDERS,
    PaymentOrders,
)
from hotledger.outbox.durable import Durability
from hotledger.outbox.events import LedgerEvent, RedPacketClaimEvent, VoucherOrderEvent
from hotledger.outbox.store import OutboxStore
from hotledger.outbox.stream_consumer import StreamConsumer
from hotledger.outbox.writer import Writer
from hotledger.reconciler import Reconciler
from hotledger.redpackets.service import PACKET_EXPIRY, RedPacketPersister, RedPackets
from hotledger.vouchers.service import Seckill, SeckillPersister


@functools.lru_cache(maxsize=1)
def id_generator() -> IdGenerator:
    return IdGenerator(scripts().client, scripts().ids_lease)


@functools.lru_cache(maxsize=1)
def lock() -> DistributedLock:
    cfg = settings()
    return DistributedLock(scripts(), cfg.lock_ttl_ms, cfg.lock_wait_ms)


@functools.lru_cache(maxsize=1)
def ledger_store() -> LedgerStore:
    return LedgerStore(scripts(), settings())


@functools.lru_cache(maxsize=1)
def ledger() -> Ledger:
    next_id = id_generator().next_id
    return Ledger(ledger_store(), Durability(settings(), publisher.publish, next_id), lock(), next_id)


@functools.lru_cache(maxsize=1)
def seckill() -> Seckill:
    return Seckill(settings(), scripts(), id_generator(), publisher.publish)


@functools.lru_cache(maxsize=1)
def redpackets() -> RedPackets:
    return RedPackets(settings(), scripts(), id_generator(), publisher.publish, ledger(), delay_queue())


@functools.lru_cache(maxsize=1)
def outbox() -> OutboxStore:
    return OutboxStore(scripts(), settings().entry_ttl_s)


@functools.lru_cache(maxsize=1)
def writer() -> Writer:
    return Writer({LedgerEvent: LedgerPersister(ledger_store(), outbox()),
                   VoucherOrderEvent: SeckillPersister(scripts(), outbox()),
                   RedPacketClaimEvent: RedPacketPersister(scripts(), outbox())}, outbox())


@functools.lru_cache(maxsize=1)
def reconciler() -> Reconciler:
    accounts = LedgerReconcile(ledger_store(), writer().persisters[LedgerEvent])
    return Reconciler(accounts, writer(), settings().reconcile_age_s, seckill(), redpackets(), journeys(),
                      payment_orders())


@functools.lru_cache(maxsize=1)
def delay_queue() -> DelayQueue:
    return DelayQueue(scripts(), settings().delay_visibility_ms)


@functools.lru_cache(maxsize=1)
def inbox() -> Inbox:
    cfg = settings()
    return Inbox(scripts(), id_generator(), cfg.inbox_ttl_s, cfg.inbox_max_messages, ledger().account_exists)


@functools.lru_cache(maxsize=1)
def payment_orders() -> PaymentOrders:
    return PaymentOrders(ledger(), delay_queue(), inbox(), id_generator(), lock(), settings().reminder_before_close_s)


@functools.lru_cache(maxsize=1)
def journeys() -> Journeys:
    return Journeys(scripts(), inbox(), parse_thresholds(settings().journeys))


def delay_handlers() -> dict:
    """The queues the scheduled drainer serves, with their handlers; other queues are served over HTTP."""
    return {ORDER_REMINDERS: payment_orders().fire_reminders, ORDER_CLOSES: payment_orders().close_due,
            PACKET_EXPIRY: redpackets().expire_due}


def delay_drainer() -> Drainer:
    return Drainer(delay_queue(), delay_handlers())


def stream_consumer(name: str) -> StreamConsumer:
    return StreamConsumer(scripts().client, writer(), settings(), name)


def reset() -> None:
    """Forget every cached service and setting (tests switching configuration)."""
    from hotledger.config import settings as cached_settings

    for cached in (outbox, id_generator, lock, ledger_store, ledger, seckill, redpackets, writer, reconciler, delay_queue, inbox,
                   payment_orders, journeys, scripts, cached_settings):
        cached.cache_clear()
