"""Webhooks' registration (hotledger.features) and service: routes; the events, written with every booking in its
transaction (its subscriber, webhooks.store.enqueue) and sent by the webhook sender function
(functions/webhook_sender); and the reconciler part that enforces their retention."""

from __future__ import annotations

from hotledger.config import settings
from hotledger.features import Feature
from hotledger.ledger.tx import Booking
from hotledger.monitors.store import Alert
from hotledger.reconciler import PartContext, ReconcilePart
from hotledger.runtime import service
from hotledger.webhooks.secrets import SecretBox
from hotledger.webhooks.service import Webhooks, lambda_poster
from hotledger.webhooks.store import WebhookStore, enqueue


@service
def webhooks() -> Webhooks:
    cfg = settings()
    webhooks_service = Webhooks(
        WebhookStore(),
        cfg.webhook_allow_local == "1",
        max_endpoints=cfg.webhook_max_endpoints,
        box=SecretBox(cfg.webhook_secrets_key_id or None),  # in AWS: the stack's KMS key (envelope at rest)
    )
    if cfg.webhook_poster_function:  # in AWS: each attempt is posted by the poster function, outside the VPC
        webhooks_service.post = lambda_poster(cfg.webhook_poster_function)
    return webhooks_service


def _enqueue(booking: Booking) -> None:
    """The booked entries' events, and those of the crossings the monitors raised of them (registered before)."""
    enqueue(booking.cursor, booking.rows, [crossing for crossing in booking.raised if isinstance(crossing, Alert)])


def _reconcile_parts() -> tuple[ReconcilePart, ...]:
    retention_ms = settings().webhook_retention_days * 86_400_000

    def prune(run: PartContext) -> None:
        run.report.webhooks_pruned = webhooks().store.prune(run.now_ms - retention_ms, run.budget)

    return (ReconcilePart(name="webhooks", run=prune),)


FEATURE = Feature(
    name="webhooks", routes="hotledger.webhooks.routes", reconcile_parts=_reconcile_parts, on_booked=_enqueue
)
