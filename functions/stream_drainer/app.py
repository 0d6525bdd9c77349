"""EventBridge-scheduled drainer of the Redis Streams transport (EVENT_TRANSPORT=redis-stream).

Each run is a consumer of the group: it first reclaims what dead consumers left pending, then reads,
persists and acknowledges until STOP_BEFORE_TIMEOUT_MS before its timeout. With a rate(1 minute)
schedule and a 60 s timeout, one run follows the other and an event waits at most one BLOCK
(STREAM_BLOCK_MS) plus a batch commit, except in the few seconds between two runs. With the Kafka
transport it returns at once (MSK triggers the writer instead)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from hotledger import observability
from hotledger.config import settings
from hotledger.runtime import stream_consumer

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = observability.logger()
metrics = observability.metrics()
tracer = observability.tracer()
STOP_BEFORE_TIMEOUT_MS = 3000


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if settings().event_transport != "redis-stream":
        return {"skipped": "EVENT_TRANSPORT is not redis-stream"}
    consumer = stream_consumer(context.aws_request_id)
    # leave room for the last BLOCK and batch commit before the timeout
    margin_ms = STOP_BEFORE_TIMEOUT_MS + settings().stream_block_ms
    report = consumer.drain(lambda: context.get_remaining_time_in_millis() > margin_ms)
    consumer.forget_idle_consumers()
    metrics.add_metric(name="StreamApplied", unit=MetricUnit.Count, value=report.applied)
    metrics.add_metric(name="StreamReclaimed", unit=MetricUnit.Count, value=report.reclaimed)
    metrics.add_metric(name="StreamDeadLettered", unit=MetricUnit.Count, value=report.dead_lettered)
    logger.info("stream drained", extra=asdict(report))
    return asdict(report)
