"""Process-wide wiring of the adapters into the domain services (built once per Lambda container)."""

from __future__ import annotations

import functools

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
from hotledger.dal.redis_store import lua, stream_flag
from hotledger.features import registered
from hotledger.grants.service import Grants
from hotledger.grants.store import GrantStore
from hotledger.history.service import History
from hotledger.history.store import HistoryStore
from hotledger.holds.service import Holds
from hotledger.holds.store import HoldStore
from hotledger.ledger.persist import LedgerPersister
from hotledger.ledger.reconcile import LedgerReconcile
from hotledger.ledger.rows import MAX_BALANCE
from hotledger.ledger.service import Ledger
from hotledger.ledger.store import LedgerStore
from hotledger.monitors.service import Monitors
from hotledger.monitors.store import MonitorStore
from hotledger.notices.inbox import Inbox
from hotledger.notices.journeys import Journeys, parse_thresholds
from hotledger.notices.payment_orders import PaymentOrders
from hotledger.notices.store import InboxStore, JourneyStore, PaymentOrderStore
from hotledger.ops.service import Operations, Transport
from hotledger.ops.store import OpsLog
from hotledger.outbox.durable import Durability
from hotledger.outbox.log_hold import LogHold
from hotledger.outbox.store import EventStreams, OutboxStore
from hotledger.outbox.stream_consumer import StreamConsumer
from hotledger.outbox.writer import Writer
from hotledger.reconciler import Reconciler
from hotledger.redpackets.persist import RedPacketPersister
from hotledger.redpackets.reconcile import PacketReconciler
from hotledger.redpackets.service import RedPackets
from hotledger.redpackets.store import PacketCache, PacketStore
from hotledger.refunds.service import Refunds
from hotledger.refunds.store import RefundStore
from hotledger.transfers.reconcile import TransferReconciler
from hotledger.transfers.service import Transfers
from hotledger.transfers.store import TransferStore
from hotledger.vouchers.persist import VoucherPersister
from hotledger.vouchers.reconcile import VoucherReconciler
from hotledger.vouchers.service import Vouchers
from hotledger.vouchers.store import VoucherDb, VoucherRedis
from hotledger.webhooks.secrets import SecretBox
from hotledger.webhooks.service import Webhooks, lambda_poster
from hotledger.webhooks.store import WebhookStore


@functools.lru_cache(maxsize=1)
def event_keys() -> EventKeys:
    cfg = settings()
    return EventKeys(cfg.event_keys_secret_arn or None, cfg.event_keys or None, cfg.event_keys_max_age_s)


def durability() -> Durability:
    cfg = settings()
    return Durability(cfg, publisher.publish, id_generator().next_id, event_keys())


@functools.lru_cache(maxsize=1)
def id_generator() -> IdGenerator:
    return IdGenerator(lua())


@functools.lru_cache(maxsize=1)
def idempotency() -> Idempotency:
    cfg = settings()
    return Idempotency(lua(), cfg.idempotency_ttl_s, cfg.idempotency_lease_ms, cfg.max_idempotency_keys)


@functools.lru_cache(maxsize=1)
def lock() -> DistributedLock:
    cfg = settings()
    return DistributedLock(lua(), cfg.lock_ttl_ms, cfg.lock_wait_ms)


@functools.lru_cache(maxsize=1)
def ledger_store() -> LedgerStore:
    return LedgerStore(lua(), settings())


@functools.lru_cache(maxsize=1)
def ledger() -> Ledger:
    next_id = id_generator().next_id
    return Ledger(ledger_store(), durability(), lock(), next_id, log_hold(), settings().rebuild_hold_ms)


@functools.lru_cache(maxsize=1)
def holds() -> Holds:
    cfg = settings()
    return Holds(
        HoldStore(lua(), stream_flag(cfg), cfg.entry_ttl_s, cfg.max_pending_entries),
        durability(),
        ledger(),
        delay_queue(),
        id_generator().next_id,
    )


@functools.lru_cache(maxsize=1)
def grants() -> Grants:
    cfg = settings()
    return Grants(
        GrantStore(lua(), stream_flag(cfg), cfg.entry_ttl_s),
        durability(),
        ledger(),
        delay_queue(),
        id_generator().next_id,
    )


@functools.lru_cache(maxsize=1)
def refunds() -> Refunds:
    cfg = settings()
    return Refunds(
        RefundStore(lua(), stream_flag(cfg), cfg.entry_ttl_s, MAX_BALANCE),
        durability(),
        ledger(),
        holds(),
        id_generator().next_id,
    )


@functools.lru_cache(maxsize=1)
def webhooks() -> Webhooks:
    cfg = settings()
    service = Webhooks(
        WebhookStore(),
        cfg.webhook_allow_local == "1",
        max_endpoints=cfg.webhook_max_endpoints,
        box=SecretBox(cfg.webhook_secrets_key_id or None),  # in AWS: the stack's KMS key (envelope at rest)
    )
    if cfg.webhook_poster_function:  # in AWS: each attempt is posted by the poster function, outside the VPC
        service.post = lambda_poster(cfg.webhook_poster_function)
    return service


@functools.lru_cache(maxsize=1)
def monitors() -> Monitors:
    return Monitors(MonitorStore(), inbox(), ledger().account_exists, formatter=lambda u: currencies().of(u).format)


@functools.lru_cache(maxsize=1)
def history() -> History:
    return History(HistoryStore(), ledger().pending_entries, ledger().account_exists)


@functools.lru_cache(maxsize=1)
def voucher_redis() -> VoucherRedis:
    cfg = settings()
    return VoucherRedis(lua(), stream_flag(cfg), cfg.entry_ttl_s)


@functools.lru_cache(maxsize=1)
def vouchers() -> Vouchers:
    cfg = settings()
    return Vouchers(cfg, VoucherDb(), voucher_redis(), durability(), id_generator().next_id, log_hold())


def packet_cache() -> PacketCache:
    """Stateless: the service and the writer's persister each hold one."""
    cfg = settings()
    return PacketCache(lua(), stream_flag(cfg), cfg.entry_ttl_s, cfg.finished_keys_ttl_s)


@functools.lru_cache(maxsize=1)
def redpackets() -> RedPackets:
    cfg = settings()
    return RedPackets(
        PacketStore(),
        packet_cache(),
        durability(),
        id_generator().next_id,
        ledger(),
        delay_queue(),
        cfg.rebuild_hold_ms,
        log_hold(),
    )


@functools.lru_cache(maxsize=1)
def outbox() -> OutboxStore:
    return OutboxStore(lua(), settings().entry_ttl_s)


@functools.lru_cache(maxsize=1)
def log_hold() -> LogHold:
    cfg = settings()
    return LogHold(outbox(), publisher.end_offsets, cfg.kafka_topic, streamed=cfg.event_transport == "redis-stream")


@functools.lru_cache(maxsize=1)
def ledger_persister() -> LedgerPersister:
    return LedgerPersister(ledger_store(), outbox())


@functools.lru_cache(maxsize=1)
def voucher_persister() -> VoucherPersister:
    return VoucherPersister(VoucherDb(), voucher_redis(), outbox())


@functools.lru_cache(maxsize=1)
def redpacket_persister() -> RedPacketPersister:
    return RedPacketPersister(PacketStore(), packet_cache(), outbox(), redpackets().credit_grab, redpackets().undo_grab)


@functools.lru_cache(maxsize=1)
def writer() -> Writer:
    """Every registered feature's persisters, by the event type each persists."""
    return Writer(
        {event_type: persister for feature in registered() for event_type, persister in feature.persisters().items()},
        outbox(),
    )


@functools.lru_cache(maxsize=1)
def ledger_reconcile() -> LedgerReconcile:
    cfg = settings()
    return LedgerReconcile(ledger_store(), ledger_persister(), cfg.reconcile_page, cfg.reconcile_pending_limit)


@functools.lru_cache(maxsize=1)
def voucher_reconciler() -> VoucherReconciler:
    return VoucherReconciler(vouchers(), voucher_persister(), VoucherDb(), voucher_redis())


@functools.lru_cache(maxsize=1)
def packet_reconciler() -> PacketReconciler:
    return PacketReconciler(redpackets(), redpacket_persister(), PacketStore())


@functools.lru_cache(maxsize=1)
def reconciler() -> Reconciler:
    """Every registered feature's reconcile parts, in the registry's order."""
    cfg = settings()
    parts = [part for feature in registered() for part in feature.reconcile_parts()]
    return Reconciler(parts, cfg.reconcile_age_s, Cursors(lua().client), cfg.reconcile_part_items, cfg.reconcile_part_s)


@functools.lru_cache(maxsize=1)
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


@functools.lru_cache(maxsize=1)
def inbox() -> Inbox:
    cfg = settings()
    return Inbox(InboxStore(lua()), id_generator(), cfg.inbox_ttl_s, cfg.inbox_max_messages, ledger().account_exists)


@functools.lru_cache(maxsize=1)
def payment_orders() -> PaymentOrders:
    return PaymentOrders(
        PaymentOrderStore(),
        ledger(),
        delay_queue(),
        inbox(),
        id_generator(),
        lock(),
        settings().reminder_before_close_s,
        pay_horizon_ms=ledger_store().idempotency_stale_ms,
    )


@functools.lru_cache(maxsize=1)
def journeys() -> Journeys:
    return Journeys(JourneyStore(lua()), inbox(), parse_thresholds(settings().journeys))


def delay_handlers() -> dict[str, Handler]:
    """The queues the scheduled drainer serves (every registered feature's), with their handlers; other queues are
    served over HTTP."""
    return {queue: handle for feature in registered() for queue, handle in feature.delay_handlers().items()}


def delay_drainer() -> Drainer:
    return Drainer(delay_queue(), delay_handlers())


@functools.lru_cache(maxsize=1)
def operations() -> Operations:
    cfg = settings()
    client = lua().client

    def append_to_stream(stream: str, value: bytes) -> None:
        client.xadd(stream, {"e": value})

    transport = Transport(
        streamed=cfg.event_transport == "redis-stream",
        topic=cfg.kafka_topic,
        republish=publisher.republish,
        read=publisher.read,
        shards=cfg.stream_shards,
        append_to_stream=append_to_stream,
    )
    return Operations(
        outbox=outbox(),
        streams=EventStreams(client, cfg.stream_group),
        webhooks=webhooks(),
        delay_queue=delay_queue(),
        delay_queues=lambda: sorted(delay_handlers()),
        ledger_store=ledger_store(),
        cursors=Cursors(client),
        part_names=lambda: [part.name for part in reconciler().parts],
        transport=transport,
        lua=lua(),
        ops_log=OpsLog(),
        key_retention_ms=cfg.key_retention_days * 86_400_000,
    )


def stream_consumer(name: str) -> StreamConsumer:
    return StreamConsumer(EventStreams(lua().client, settings().stream_group), writer(), settings(), name)


def reset() -> None:
    """Forget every cached service and setting (tests switching configuration): every cached factory of this module,
    found rather than listed, so a new one is never left out."""
    for cached in [value for value in globals().values() if hasattr(value, "cache_clear")]:
        cached.cache_clear()


@functools.lru_cache(maxsize=1)
def currencies() -> Currencies:
    return Currencies(CurrencyStore(lua()), settings().default_currency)


@functools.lru_cache(maxsize=1)
def transfers() -> Transfers:
    return Transfers(
        TransferStore(), ledger(), currencies(), delay_queue(), id_generator().next_id, settings().idempotency_lease_ms
    )


@functools.lru_cache(maxsize=1)
def transfer_reconciler() -> TransferReconciler:
    return TransferReconciler(transfers(), TransferStore())
