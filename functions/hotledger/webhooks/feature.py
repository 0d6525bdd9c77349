"""Webhooks' registration (hotledger.features): routes; the deliveries are written with the ledger's bookings
(webhooks.store.enqueue) and sent by the webhook sender function (functions/webhook_sender)."""

from __future__ import annotations

from hotledger.features import Feature

FEATURE = Feature(name="webhooks", routes="hotledger.webhooks.routes")
