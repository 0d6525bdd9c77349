"""The feature registry: what each feature adds to the API, the writer, the reconciler, the delay drainer and the
booking transaction, declared once in its own package (`<feature>/feature.py`, which also builds its services) and
listed once below, by module name. api/app.py includes every feature's router and api/authorization.py its rules;
runtime.py builds the writer from every feature's persisters and the drainer from every feature's delay handlers;
the reconciler runs every feature's parts and a booking calls every feature's subscriber in this order. Adding a
feature is one package and one line in FEATURES (docs/adding-a-feature.md walks through holds).

The registry names the features' modules rather than importing them: a feature's module may then use what the
registry gathers (the ledger hands every booking to the subscribers, the operators' console lists every queue and
part) without an import circle (tests/unit/test_import_graph.py)."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hotledger.ledger.tx import Booking, OnBooked
    from hotledger.reconciler import PartContext, ReconcilePart

# every feature's registration module, in the order the API matches routes (the hot routes first), the reconciler
# runs parts and a booking's subscribers run (monitors before webhooks: the webhooks send the monitors' crossings)
FEATURES = (
    "hotledger.ledger.feature",
    "hotledger.holds.feature",
    "hotledger.grants.feature",
    "hotledger.refunds.feature",
    "hotledger.history.feature",
    "hotledger.vouchers.feature",
    "hotledger.redpackets.feature",
    "hotledger.transfers.feature",
    "hotledger.notices.feature",
    "hotledger.monitors.feature",
    "hotledger.webhooks.feature",
    "hotledger.ops.feature",
)


@dataclass(frozen=True, kw_only=True)
class Feature:
    name: str
    # the module holding its API: `router` (a Powertools Router) and `RULES` ({(method, path): api.rules.Rule});
    # imported by the API function only (the writer, reconciler and drainers never load Powertools' resolver)
    routes: str | None = None
    # built on first use, in the process that needs them (the services come from the feature's own feature.py)
    persisters: Callable[[], dict[type, Any]] = dict  # event class -> its persister (outbox.writer.Persister)
    reconcile_parts: Callable[[], tuple[ReconcilePart, ...]] = tuple
    delay_handlers: Callable[[], dict[str, Callable[[list[str]], Any]]] = dict  # queue -> handler of due elements
    # called with every booking's ledger rows inside the booking transaction (ledger/tx.py: insert_booked), so what
    # it writes with the booking's cursor commits exactly with them
    on_booked: OnBooked | None = None
    # what on_booked reads of one account's booking, as (sql, args): a SYNC charge reads it in its first round trip
    # under the row lock and hands its rows as Booking.prefetched[name] (its writes then go out in one batch)
    booking_read: Callable[[int], tuple[str, Any]] | None = None


@functools.cache
def registered() -> tuple[Feature, ...]:
    """Every feature, in the order of FEATURES, then the keys part."""
    return (*(importlib.import_module(module).FEATURE for module in FEATURES), KEYS)


def booking_reads(user_id: int) -> list[tuple[str, tuple[str, Any]]]:
    """The registered subscribers' reads of one account's booking, by feature name, in the registry's order."""
    return [(f.name, f.booking_read(user_id)) for f in registered() if f.booking_read is not None]


def tell_booked(booking: Booking) -> None:
    """Hand a booking to every registered feature's subscriber, in the registry's order."""
    for feature in registered():
        if feature.on_booked is not None:
            feature.on_booked(booking)


@dataclass
class PruneKeys:
    """The keys part: Idempotency-Key and rollback records older than retention_ms deleted (dal/retention.py)."""

    retention_ms: int

    def __call__(self, run: PartContext) -> None:
        from hotledger.dal import retention

        run.report.keys_pruned = sum(retention.prune(run.now_ms - self.retention_ms, run.budget).values())


def _prune_keys_part() -> tuple[ReconcilePart, ...]:
    from hotledger.config import settings
    from hotledger.reconciler import ReconcilePart

    return (ReconcilePart(name="keys", run=PruneKeys(settings().key_retention_days * 86_400_000)),)


# Idempotency-Key and rollback records of every feature, deleted past KEY_RETENTION_DAYS (dal/retention.py)
KEYS = Feature(name="keys", reconcile_parts=_prune_keys_part)
