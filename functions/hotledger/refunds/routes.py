"""Refund routes: POST /accounts/{id}/orders/{order_id}/refunds and /accounts/{id}/holds/{hold_id}/refunds."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from aws_lambda_powertools.metrics import MetricUnit
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from api.idempotency import KEY_CONFLICT, TOO_MANY_KEYS, Attempt, RouteKey, once
from api.responses import UNAVAILABLE, responses
from api.rules import SERVICE, only
from api.schemas import Amount
from hotledger import observability
from hotledger.refunds.feature import refunds
from hotledger.refunds.service import HOLD, ORDER, RefundResult
from hotledger.runtime import currencies

router = Router()
metrics = observability.metrics()
UserId = Annotated[int, Path(gt=0, lt=2**31)]
ChargeId = Annotated[int, Path(gt=0, lt=2**63)]
_REFUSED = (
    409,
    "REFUND_EXCEEDS_CHARGE: more than was charged would be refunded in total; HOLD_NOT_ENDED; CHARGE_NOT_BOOKED: "
    "retry once the charge is booked; NOT_REFUNDABLE: the service's own charge; " + KEY_CONFLICT[1],
)


class RefundRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: Amount
    reason: Annotated[StrictStr, Field(max_length=500)] = ""


class RefundAnswer(BaseModel):
    refund_id: str = Field(description="63-bit id as a string")
    order_id: str | None = Field(None, description="the refunded deduct (refunds of an order)")
    hold_id: str | None = Field(None, description="the refunded hold (refunds of what a hold captured)")
    amount: str
    refunded_total: str | None = Field(description="of the charge, after this refund (null on a resumed request)")
    balance: str | None = Field(description="the account's balance after the refund (null on a resumed request)")


def _answer(result: RefundResult) -> dict[str, Any]:
    r = result.refund
    format_minor = currencies().of(r.user_id).format
    return {
        "refund_id": str(r.refund_id),
        f"{r.charge_kind}_id": str(r.charge_id),
        "amount": format_minor(r.amount),
        "refunded_total": None if r.refunded_after is None else format_minor(r.refunded_after),
        "balance": None if result.balance is None else format_minor(result.balance),
    }


def _refund(
    user_id: int, kind: str, charge_id: int, request: RefundRequest, idempotency_key: str | None, path: str
) -> Response[str]:
    def run(attempt: Attempt) -> dict[str, Any]:
        result = refunds().refund(
            user_id,
            kind,
            charge_id,
            currencies().minor(user_id, request.amount),
            request.reason,
            attempt.remember,
            attempt.resumed_from,
        )
        metrics.add_metric(name="Refunds", unit=MetricUnit.Count, value=1)
        return _answer(result)

    return once(
        f"account:{user_id}",
        idempotency_key,
        f"POST {path}",
        request.model_dump(),
        run,
        status=201,
        resumable=True,
        durable=True,
    )


@router.post(
    "/accounts/<user_id>/orders/<order_id>/refunds",
    status_code=201,
    responses=responses(
        201,
        RefundAnswer,
        "refunded: a credit, spendable once durable",
        (404, "ACCOUNT_NOT_FOUND or ORDER_NOT_FOUND"),
        UNAVAILABLE,
        _REFUSED,
        TOO_MANY_KEYS,
        (422, "BALANCE_LIMIT or invalid input"),
    ),
)
def refund_order(
    user_id: UserId, order_id: ChargeId, request: Annotated[RefundRequest, Body()], idempotency_key: RouteKey = None
) -> Response[str]:
    return _refund(user_id, ORDER, order_id, request, idempotency_key, f"/accounts/{user_id}/orders/{order_id}/refunds")


@router.post(
    "/accounts/<user_id>/holds/<hold_id>/refunds",
    status_code=201,
    responses=responses(
        201,
        RefundAnswer,
        "refunded: a credit, spendable once durable",
        (404, "ACCOUNT_NOT_FOUND or HOLD_NOT_FOUND"),
        UNAVAILABLE,
        _REFUSED,
        TOO_MANY_KEYS,
        (422, "BALANCE_LIMIT or invalid input"),
    ),
)
def refund_hold(
    user_id: UserId, hold_id: ChargeId, request: Annotated[RefundRequest, Body()], idempotency_key: RouteKey = None
) -> Response[str]:
    return _refund(user_id, HOLD, hold_id, request, idempotency_key, f"/accounts/{user_id}/holds/{hold_id}/refunds")


# refunds are the merchant's (services): a support agent's tool calls them through the backend
RULES = {
    ("POST", "/accounts/<user_id>/orders/<order_id>/refunds"): only(SERVICE),
    ("POST", "/accounts/<user_id>/holds/<hold_id>/refunds"): only(SERVICE),
}
