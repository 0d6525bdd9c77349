"""EventBridge-scheduled webhook sender (rate 1 minute, 60 s timeout): sends the due deliveries the writer and the SYNC
path wrote with their bookings (hotledger.webhooks), in order per account per endpoint, until shortly before its
timeout. In the VPC (it reads the DB): it fans the bookings' events out to the endpoints' deliveries, signs each
attempt and hands it to the poster function outside the VPC (WEBHOOK_POSTER_FUNCTION; the stack's VPC has no NAT),
then records what it answered.
Metrics: WebhooksDelivered, WebhooksRetried, WebhooksDeadLettered (alarm on > 0: an endpoint failed for 3 days),
WebhookEndpointsDisabled (an endpoint answered 410 Gone)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from hotledger import observability
from hotledger.webhooks.feature import webhooks

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = observability.logger()
metrics = observability.metrics()
tracer = observability.tracer()
# no attempt starts later; those in flight end LAST_ATTEMPT_S (5 s) after it at the latest (their deadline, otherwise
# SEND_TIMEOUT_S, is cut to that), leaving 5 s to record them and flush the metrics
STOP_BEFORE_TIMEOUT_MS = 10_000


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, int]:
    seconds = max(1.0, (context.get_remaining_time_in_millis() - STOP_BEFORE_TIMEOUT_MS) / 1000)
    counts = webhooks().send_due(seconds=seconds, idle_wait_s=1.0)  # a new event goes out within about a second
    metrics.add_metric(name="WebhookEndpointsDisabled", unit=MetricUnit.Count, value=counts["disabled"])
    metrics.add_metric(name="WebhooksDelivered", unit=MetricUnit.Count, value=counts["delivered"])
    metrics.add_metric(name="WebhooksRetried", unit=MetricUnit.Count, value=counts["retried"])
    metrics.add_metric(name="WebhooksDeadLettered", unit=MetricUnit.Count, value=counts["dead"])
    logger.info("webhooks sent", extra=counts)
    return counts
