"""EventBridge-scheduled reconciler: compensate stale pending entries, correct or evict stale caches,
and publish the pending gauge. Each part works within its own budget and continues next run where it stopped;
a part that failed is logged and counted (ReconcilerFailedParts) while the others run."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from hotledger import observability
from hotledger.runtime import reconciler

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = observability.logger()
metrics = observability.metrics()
tracer = observability.tracer()


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = reconciler().run(int(time.time() * 1000))
    metrics.add_metric(name="PendingOrders", unit=MetricUnit.Count, value=report.pending)
    metrics.add_metric(name="OldestPendingAge", unit=MetricUnit.Seconds, value=report.oldest_pending_age_s)
    metrics.add_metric(name="Compensated", unit=MetricUnit.Count, value=report.compensated)
    metrics.add_metric(name="CacheCorrected", unit=MetricUnit.Count, value=report.corrected)
    metrics.add_metric(name="CacheCorrectionDeferred", unit=MetricUnit.Count, value=report.deferred)
    metrics.add_metric(name="ReconcilerFailedParts", unit=MetricUnit.Count, value=len(report.failed_parts))
    # grab credits the ledger refused or could not make: retried every run, alarmed on while they keep failing
    metrics.add_metric(name="CreditFailures", unit=MetricUnit.Count, value=report.packets.credit_failed)
    # 1 while a pass over the accounts is unfinished (its budget ran out): alarm when it stays 1 for long
    metrics.add_metric(name="ReconcilerAccountsBehind", unit=MetricUnit.Count, value=int(report.next_after != 0))
    logger.info("reconciled", extra=asdict(report))
    return asdict(report)
