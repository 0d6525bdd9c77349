"""EventBridge-scheduled delay-queue drainer (rate 1 minute, 60 s timeout).

Each run first hands over everything overdue (what a dead run left taken comes back after its visibility
timeout), then sleeps until the earliest due time, woken early by an offer that publishes an earlier one,
and keeps going until STOP_BEFORE_TIMEOUT_MS before its timeout. So an element fires within
milliseconds of its due time while a run is on, and at worst that margin plus a cold start late."""
from __future__ import annotations

from aws_lambda_powertools.metrics import MetricUnit

from hotledger import observability
from hotledger.runtime import delay_drainer

logger = observability.logger()
metrics = observability.metrics()
STOP_BEFORE_TIMEOUT_MS = 2000


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict, context) -> dict:
    drainer = delay_drainer()
    # the drainer sleeps at most its idle wait (1 s) at a time: leave that and a batch's handling before the timeout
    handled = drainer.run(lambda: context.get_remaining_time_in_millis() > STOP_BEFORE_TIMEOUT_MS + drainer.idle_wait_ms)
    metrics.add_metric(name="DelayElementsHandled", unit=MetricUnit.Count, value=handled)
    logger.info("delay queues drained", extra={"handled": handled})
    return {"handled": handled}
