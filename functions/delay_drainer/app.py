"""EventBridge-scheduled delay-queue drainer (rate 1 minute, 60 s timeout).

Each run first hands over everything overdue (what a dead run left taken comes back after its visibility
timeout), then sleeps until the earliest due time, woken early by an offer that publishes an earlier one,
and keeps going until STOP_BEFORE_TIMEOUT_MS before its timeout. So an element fires within
milliseconds of its due time while a run is on, and at worst that margin plus a cold start late.
A handler that raises does not end the run: its element comes back after an exponential backoff and, after
DELAY_MAX_DELIVERIES deliveries, moves to the queue's dead letters (GET /delay-queues/{queue}/dead-letters).
Metrics per queue (dimension `queue`): DelayQueueDepth (waiting), DelayOldestDueLagMs (how overdue the earliest
waiting element is), DelayRedeliveries, DelayHandlerFailures, DelayDeadLettered (this run) and DelayDeadLetters
(in the dead letters now; alarm on > 0)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from hotledger import observability
from hotledger.runtime import delay_drainer

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from hotledger.dal.delay_queue import Drainer

logger = observability.logger()
metrics = observability.metrics()
tracer = observability.tracer()
STOP_BEFORE_TIMEOUT_MS = 2000


def _queue_metrics(drainer: Drainer) -> None:
    """One EMF record per queue, with the queue as a dimension."""
    for name, seen in drainer.runs.items():
        stats = drainer.queue.stats(name)
        per_queue = EphemeralMetrics(namespace=observability.NAMESPACE, service=observability.SERVICE)
        per_queue.add_dimension(name="queue", value=name)
        per_queue.add_metric(name="DelayQueueDepth", unit=MetricUnit.Count, value=stats.waiting)
        per_queue.add_metric(name="DelayOldestDueLagMs", unit=MetricUnit.Milliseconds, value=stats.oldest_due_lag_ms)
        per_queue.add_metric(name="DelayRedeliveries", unit=MetricUnit.Count, value=seen.redeliveries)
        per_queue.add_metric(name="DelayHandlerFailures", unit=MetricUnit.Count, value=seen.failures)
        per_queue.add_metric(name="DelayDeadLettered", unit=MetricUnit.Count, value=seen.dead_lettered)
        per_queue.add_metric(name="DelayDeadLetters", unit=MetricUnit.Count, value=stats.dead)
        per_queue.flush_metrics()
        if stats.dead:
            logger.warning("delay queue has dead letters", extra={"queue": name, "dead_letters": stats.dead})


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    drainer = delay_drainer()
    # the drainer sleeps at most its idle wait (1 s) at a time: leave that and a batch's handling before the timeout
    handled = drainer.run(
        lambda: context.get_remaining_time_in_millis() > STOP_BEFORE_TIMEOUT_MS + drainer.idle_wait_ms
    )
    metrics.add_metric(name="DelayElementsHandled", unit=MetricUnit.Count, value=handled)
    _queue_metrics(drainer)
    logger.info("delay queues drained", extra={"handled": handled})
    return {
        "handled": handled,
        "queues": {
            name: {
                "handled": seen.handled,
                "redeliveries": seen.redeliveries,
                "failures": seen.failures,
                "dead_lettered": seen.dead_lettered,
            }
            for name, seen in drainer.runs.items()
        },
    }
