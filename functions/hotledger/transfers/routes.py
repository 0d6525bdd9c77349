"""Transfer routes: move money from one account to another of the same currency, read a transfer."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from aws_lambda_powertools.metrics import MetricUnit
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from api.idempotency import KEY_CONFLICT, TOO_MANY_KEYS, Attempt, RouteKey, once
from api.responses import responses
from api.rules import ADMIN, SERVICE, HiddenOwner, body_field, only
from api.schemas import Amount, UserRef
from hotledger import errors, observability
from hotledger.runtime import currencies
from hotledger.transfers.feature import transfers
from hotledger.transfers.rows import Transfer

router = Router()
logger = observability.logger()
metrics = observability.metrics()
TransferId = Annotated[int, Path(gt=0, lt=2**63)]


class TransferRequest(BaseModel):
    """from and to are accounts of the same currency; amount in it (its digits)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False)
    from_: UserRef = Field(alias="from", description="the payer's account")
    to: UserRef = Field(description="the payee's account")
    amount: Amount
    description: Annotated[StrictStr, Field(max_length=500)] = ""


class TransferView(BaseModel):
    transfer_id: str = Field(description="63-bit id as a string")
    state: Literal["PENDING", "DEBITED", "CREDITED", "POSTED", "RELEASING", "FAILED"] = Field(
        description="PENDING: the payer's debit is being made; DEBITED: it is durable, the amount is in flight (the "
        "payee's credit follows within seconds); CREDITED: the credit is durable too (the payee can spend it); POSTED: "
        "both legs are booked in the DB; RELEASING: the credit was refused for good and the debit is being given back; "
        "FAILED: the debit was refused, or given back (see failure)"
    )
    from_: int = Field(alias="from", serialization_alias="from")
    to: int
    amount: str
    currency: str
    description: str
    debit_entry_id: str | None = Field(description="the payer's history entry (type transfer_debit)")
    credit_entry_id: str | None = Field(description="the payee's history entry (type transfer_credit)")
    release_entry_id: str | None = Field(description="the payer's entry giving a failed transfer's debit back")
    failure: str | None = Field(description="CODE: message of what failed it")
    created_at: int = Field(description="epoch ms the transfer was asked for")
    updated_at: int = Field(description="epoch ms the transfer reached its state")


def _view(t: Transfer) -> dict[str, Any]:
    format_minor = currencies().of(t.from_id).format
    return {
        "transfer_id": str(t.transfer_id),
        "state": t.state,
        "from": t.from_id,
        "to": t.to_id,
        "amount": format_minor(t.amount),
        "currency": t.currency,
        "description": t.description,
        "debit_entry_id": None if t.debit_id is None else str(t.debit_id),
        "credit_entry_id": None if t.credit_id is None else str(t.credit_id),
        "release_entry_id": None if t.release_id is None else str(t.release_id),
        "failure": t.failure,
        "created_at": t.created_at,
        "updated_at": t.updated_at,
    }


@router.post(
    "/transfers",
    status_code=201,
    responses=responses(
        201,
        TransferView,
        "the transfer: CREDITED (or POSTED) normally; DEBITED when the payee's credit could not be made now (it follows "
        "by itself: the amount is in flight meanwhile); FAILED with the payee's refusal when the credit was refused for "
        "good and the debit given back",
        (
            503,
            "SERVICE_UNAVAILABLE, PUBLISH_FAILED or RECOVERING: nothing was changed, retry; OUTCOME_UNKNOWN: the "
            "payer may have been debited, GET /transfers/{error.transfer_id} (it goes on by itself) or retry with the "
            "same Idempotency-Key",
        ),
        (402, "INSUFFICIENT_BALANCE: the payer's balance minus the amount would fall below its threshold"),
        (403, "API_CLOSED: the payer's API is closed"),
        (404, "ACCOUNT_NOT_FOUND: from or to"),
        (409, "ACCOUNT_CLOSED: the payee was closed by an operator; TRANSFER_FAILED; " + KEY_CONFLICT[1]),
        (
            422,
            "SAME_ACCOUNT: from = to; CURRENCY_MISMATCH: the accounts hold different currencies; INVALID_AMOUNT: more "
            "fractional digits than their currency has",
        ),
        (
            429,
            "TOO_MANY_PENDING: the payer's charges are not reaching the DB; " + TOO_MANY_KEYS[1] + "; retry later",
        ),
    ),
)
def create_transfer(request: Annotated[TransferRequest, Body()], idempotency_key: RouteKey = None) -> Response[str]:
    return once(
        f"account:{request.from_}",
        idempotency_key,
        "POST /transfers",
        request.model_dump(by_alias=True),
        lambda attempt: _create(request, attempt),
        status=201,
        resumable=True,
        durable=True,
    )


def _create(request: TransferRequest, attempt: Attempt) -> dict[str, Any]:
    """The transfer's id is the key's recovery point, kept before the payer is debited: an attempt resuming a dead
    one goes on with that transfer (each leg charged at most once under the transfer's keys)."""
    args = (request.from_, request.to, request.amount, request.description)
    if attempt.resumed_from is not None:
        transfer = transfers().resume(int(attempt.resumed_from), *args)
    else:
        transfer = transfers().create(*args, reserve=lambda transfer_id: attempt.remember(str(transfer_id)))
    metrics.add_metric(name="Transfers", unit=MetricUnit.Count, value=1)
    logger.info(
        "transfer",
        extra={
            "transfer_id": str(transfer.transfer_id),
            "from": transfer.from_id,
            "to": transfer.to_id,
            "amount_minor": transfer.amount,
            "state": transfer.state,
        },
    )
    return _view(transfer)


@router.get(
    "/transfers/<transfer_id>", responses=responses(200, TransferView, "the transfer", (404, "TRANSFER_NOT_FOUND"))
)
def get_transfer(transfer_id: TransferId) -> dict[str, Any]:
    return _view(transfers().get(transfer_id))


def _payer(args: dict[str, Any]) -> int:
    return transfers().get(args["transfer_id"]).from_id


_transfer_payer = HiddenOwner(
    _payer, lambda args: errors.TransferNotFound(f"transfer {args['transfer_id']} does not exist")
)

# a service moves money between any two accounts; an end user moves their own money from their own account (the body's
# from is theirs) and reads the transfers they paid (each side reads its leg in its history)
RULES = {
    ("POST", "/transfers"): only(SERVICE, owner=body_field("from_")),
    ("GET", "/transfers/<transfer_id>"): only(SERVICE, ADMIN, owner=_transfer_payer),
}
