"""The operators' console's registration (hotledger.features) and service: admin routes only; it reads the other
features' stores and replays into the writer's transport, and owns the operators' log (t_ops_log)."""

from __future__ import annotations

from hotledger.config import settings
from hotledger.dal import publisher
from hotledger.dal.cursor import Cursors
from hotledger.dal.redis_store import lua
from hotledger.features import Feature
from hotledger.ledger.feature import ledger_store
from hotledger.ops.service import Operations, Transport
from hotledger.ops.store import OpsLog
from hotledger.outbox.store import EventStreams
from hotledger.runtime import delay_handlers, delay_queue, outbox, reconciler, service
from hotledger.webhooks.feature import webhooks


@service
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


FEATURE = Feature(name="ops", routes="hotledger.ops.routes")
