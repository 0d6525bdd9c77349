"""What the tests share, one module per kind of help; import it from here (`from helpers import Api`):
- callers.py: who the tests act as (Api, caller_context, token_for, voucher);
- records.py: the writer's side (invoke_writer, broker_records, ledger_records, signed_value, ...);
- reconcile.py: reconciler runs (reconcile, reconcile_pass, reconcile_totals);
- processes.py: the local runtime as a child process (LocalService);
- aws.py: AWS control planes in moto (moto_secrets);
- receivers.py: a local webhook receiver (Receiver), a raw or blackholed one (RawReceiver);
- resolver.py: a local DNS resolver answering a rebinding host name to the local runtime's child processes."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EVENTS = REPO / "events"

from helpers.aws import moto_secrets  # noqa: E402
from helpers.callers import TRUSTED, TRUSTED_SCOPES, Api, caller_context, token_for, voucher  # noqa: E402
from helpers.processes import LocalService  # noqa: E402
from helpers.receivers import RawReceiver, Receiver  # noqa: E402
from helpers.reconcile import reconcile, reconcile_pass, reconcile_totals  # noqa: E402
from helpers.records import (  # noqa: E402
    broker_records,
    invoke_writer,
    ledger_records,
    lift_rebuild_hold,
    rebuilt_after_the_writer_caught_up,
    records,
    run_event_keys,
    signed_value,
    verified_fields,
)

__all__ = [
    "EVENTS",
    "REPO",
    "TRUSTED",
    "TRUSTED_SCOPES",
    "Api",
    "LocalService",
    "RawReceiver",
    "Receiver",
    "broker_records",
    "caller_context",
    "invoke_writer",
    "ledger_records",
    "lift_rebuild_hold",
    "rebuilt_after_the_writer_caught_up",
    "moto_secrets",
    "reconcile",
    "reconcile_pass",
    "reconcile_totals",
    "records",
    "run_event_keys",
    "signed_value",
    "token_for",
    "verified_fields",
    "voucher",
]
