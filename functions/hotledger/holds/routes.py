"""Hold routes: authorize, capture, void, read (issue 20's API shape)."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from aws_lambda_powertools.metrics import MetricUnit
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from api.idempotency import KEY_CONFLICT, TOO_MANY_KEYS, Attempt, RouteKey, once
from api.responses import UNAVAILABLE, responses
from api.rules import ADMIN, SERVICE, only, path_arg
from api.schemas import Amount
from hotledger import observability
from hotledger.holds.feature import holds
from hotledger.holds.service import MAX_EXPIRES_IN_S, HoldView
from hotledger.runtime import currencies

router = Router()
metrics = observability.metrics()
UserId = Annotated[int, Path(gt=0, lt=2**31)]
HoldId = Annotated[int, Path(gt=0, lt=2**63)]
HoldState = Annotated[str | None, Query(pattern="^(ACTIVE|CAPTURED|VOIDED|EXPIRED)$")]
_NOT_FOUND = (404, "ACCOUNT_NOT_FOUND or HOLD_NOT_FOUND")
_ENDED = (
    "HOLD_CAPTURED, HOLD_VOIDED or HOLD_EXPIRED: the hold ended so already; HOLD_BUSY: a capture is still being "
    "recorded, retry; "
)


class AuthorizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: Amount
    expires_in_s: Annotated[StrictInt, Field(gt=0, le=MAX_EXPIRES_IN_S)] = 900
    description: Annotated[StrictStr, Field(max_length=500)] = ""


class CaptureRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: Amount | None = Field(None, description="what to capture; absent: everything left on the hold")
    final: StrictBool = Field(False, description="true: release what is left after this capture")


class HoldAnswer(BaseModel):
    hold_id: str = Field(description="63-bit id as a string")
    user_id: int
    amount: str
    captured: str
    remaining: str = Field(description="what the hold still keeps (0.00 once it ended)")
    state: str = Field(description="ACTIVE, CAPTURED, VOIDED or EXPIRED (an ACTIVE hold past expires_at reads EXPIRED)")
    expires_at: int = Field(description="epoch ms")
    created_at: int
    description: str
    balance: str | None = Field(description="the account's balance after this request (null on reads)")
    available: str | None = Field(
        description="balance - held credits - active holds after this request (null on reads)"
    )
    entry_id: str | None = Field(description="the ledger entry this request made (its history entry; null on reads)")


class HoldsPage(BaseModel):
    holds: list[HoldAnswer]
    next_after: str | None = Field(description="pass as after= for the next (older) page; null: this was the last")


def _answer(view: HoldView) -> dict[str, Any]:
    h = view.hold
    format_minor = currencies().of(h.user_id).format
    return {
        "hold_id": str(h.hold_id),
        "user_id": h.user_id,
        "amount": format_minor(h.amount),
        "captured": format_minor(h.captured),
        "remaining": format_minor(h.amount - h.captured if h.state == "ACTIVE" else 0),
        "state": h.state,
        "expires_at": h.expires_at,
        "created_at": h.created_at,
        "description": h.description,
        "balance": None if view.balance is None else format_minor(view.balance),
        "available": None if view.available is None else format_minor(view.available),
        "entry_id": None if view.entry_id is None else str(view.entry_id),
    }


@router.post(
    "/accounts/<user_id>/holds",
    status_code=201,
    responses=responses(
        201,
        HoldAnswer,
        "authorized: the amount left `available` at once",
        _NOT_FOUND,
        UNAVAILABLE,
        KEY_CONFLICT,
        TOO_MANY_KEYS,
        (402, "INSUFFICIENT_BALANCE: available - amount would fall below the threshold"),
        (403, "API_CLOSED"),
        (409, KEY_CONFLICT[1]),
    ),
)
def authorize(
    user_id: UserId, request: Annotated[AuthorizeRequest, Body()], idempotency_key: RouteKey = None
) -> Response[str]:
    def run(attempt: Attempt) -> dict[str, Any]:
        view = holds().authorize(
            user_id,
            currencies().minor(user_id, request.amount),
            request.expires_in_s,
            request.description,
            attempt.remember,
            attempt.resumed_from,
        )
        metrics.add_metric(name="HoldsAuthorized", unit=MetricUnit.Count, value=1)
        return _answer(view)

    return once(
        f"account:{user_id}",
        idempotency_key,
        f"POST /accounts/{user_id}/holds",
        request.model_dump(),
        run,
        status=201,
        resumable=True,
        durable=True,
    )


@router.post(
    "/accounts/<user_id>/holds/<hold_id>/capture",
    responses=responses(
        200,
        HoldAnswer,
        "captured: the balance went down by the amount",
        _NOT_FOUND,
        UNAVAILABLE,
        TOO_MANY_KEYS,
        (409, _ENDED + "CAPTURE_EXCEEDS_HOLD: more than is left; " + KEY_CONFLICT[1]),
    ),
)
def capture(
    user_id: UserId, hold_id: HoldId, request: Annotated[CaptureRequest, Body()], idempotency_key: RouteKey = None
) -> Response[str]:
    def run(attempt: Attempt) -> dict[str, Any]:
        return _answer(
            holds().capture(
                user_id,
                hold_id,
                None if request.amount is None else currencies().minor(user_id, request.amount),
                request.final,
                attempt.remember,
                attempt.resumed_from,
            )
        )

    return once(
        f"account:{user_id}",
        idempotency_key,
        f"POST /accounts/{user_id}/holds/{hold_id}/capture",
        request.model_dump(),
        run,
        resumable=True,
        durable=True,
    )


@router.post(
    "/accounts/<user_id>/holds/<hold_id>/void",
    responses=responses(
        200,
        HoldAnswer,
        "voided: what was left is available again",
        _NOT_FOUND,
        UNAVAILABLE,
        TOO_MANY_KEYS,
        (409, _ENDED + KEY_CONFLICT[1]),
    ),
)
def void(user_id: UserId, hold_id: HoldId, idempotency_key: RouteKey = None) -> Response[str]:
    def run(attempt: Attempt) -> dict[str, Any]:
        return _answer(holds().void(user_id, hold_id, attempt.remember, attempt.resumed_from))

    return once(
        f"account:{user_id}",
        idempotency_key,
        f"POST /accounts/{user_id}/holds/{hold_id}/void",
        None,
        run,
        resumable=True,
        durable=True,
    )


@router.get("/accounts/<user_id>/holds/<hold_id>", responses=responses(200, HoldAnswer, "the hold", _NOT_FOUND))
def get_hold(user_id: UserId, hold_id: HoldId) -> dict[str, Any]:
    return _answer(HoldView(holds().get(user_id, hold_id)))


@router.get(
    "/accounts/<user_id>/holds", responses=responses(200, HoldsPage, "the account's holds, newest first", _NOT_FOUND)
)
def list_holds(
    user_id: UserId,
    state: HoldState = None,
    limit: Annotated[int, Query(gt=0, le=200)] = 50,
    after: Annotated[int | None, Query(gt=0, lt=2**63)] = None,
) -> dict[str, Any]:
    found = holds().list(user_id, state, limit + 1, after or 0)
    page = found[:limit]
    return {
        "holds": [_answer(HoldView(h)) for h in page],
        "next_after": str(page[-1].hold_id) if len(found) > limit else None,
    }


# services authorize, capture and void (the merchant's backend); end users read their own holds
RULES = {
    ("POST", "/accounts/<user_id>/holds"): only(SERVICE),
    ("POST", "/accounts/<user_id>/holds/<hold_id>/capture"): only(SERVICE),
    ("POST", "/accounts/<user_id>/holds/<hold_id>/void"): only(SERVICE),
    ("GET", "/accounts/<user_id>/holds/<hold_id>"): only(SERVICE, ADMIN, owner=path_arg("user_id")),
    ("GET", "/accounts/<user_id>/holds"): only(SERVICE, ADMIN, owner=path_arg("user_id")),
}
