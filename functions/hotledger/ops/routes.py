"""The operators' console routes (admin scope only): dead letters and their replays, an account as Redis and the DB
hold it, an adjustment of its balance, the reconciler's parts, and the log of what operators did. `hotledger ops`
(infra/ops.py) calls these."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StrictStr, WithJsonSchema

from api.authorization import principal_of
from api.idempotency import KEY_CONFLICT, IdempotencyKey
from api.responses import UNAVAILABLE, responses
from api.rules import ADMIN, only
from hotledger import errors
from hotledger.currencies.service import minor_in
from hotledger.ledger.feature import ledger
from hotledger.ledger.kinds import KIND_ADJUST_DOWN, KIND_ADJUST_UP
from hotledger.money import parse_amount
from hotledger.ops.feature import operations
from hotledger.ops.service import SOURCES
from hotledger.runtime import currencies

router = Router()
Source = Literal["writer", "topic", "stream", "webhook"]
_BAD_ID = (422, "INVALID_DEAD_LETTER_ID")
_EXPIRED = (
    409,
    "DEAD_LETTER_EXPIRED: a named writer or stream dead letter is older than what the rollback records can still judge"
    " (KEY_RETENTION_DAYS less the log's retention and a day): nothing was replayed",
)


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: Source = Field(
        description="writer (t_dead_letter), topic (<topic>.dead-letter), stream (events:dead:*) or"
        " webhook (dead-lettered deliveries; ids are endpoint ids)"
    )
    ids: Annotated[list[Annotated[StrictStr, Field(min_length=1, max_length=64)]], Field(max_length=500)] | None = (
        Field(
            None,
            description="the dead letters to replay; absent: every one not replayed yet (topic: always all, in order)",
        )
    )


class ReplayAnswer(BaseModel):
    replayed: list[str]
    skipped: dict[str, str] = Field(
        description="id -> why it was not sent (final, replayed already, expired, no such id)"
    )


@router.get("/ops/dead-letters", responses=responses(200, dict, "each source's dead letters, by source"))
def list_dead_letters(
    source: Annotated[str | None, Query(pattern="^(writer|topic|stream|webhook|delay)$")] = None,
    limit: Annotated[int, Query(gt=0, le=500)] = 100,
) -> dict[str, list[dict[str, Any]]]:
    return operations().dead_letters((source,) if source else SOURCES, limit)


@router.post(
    "/ops/dead-letters/replay",
    responses=responses(200, ReplayAnswer, "what was sent again and what was not, and why; logged", _BAD_ID, _EXPIRED),
)
def replay_dead_letters(request: Annotated[ReplayRequest, Body()]) -> dict[str, Any]:
    outcome = operations().replay(request.source, request.ids, principal_of(router.current_event))
    return {"replayed": outcome.replayed, "skipped": outcome.skipped}


@router.get(
    "/ops/accounts/<user_id>",
    responses=responses(
        200,
        dict,
        "the account in the DB and in Redis, its pending entries, whether they agree",
        (404, "ACCOUNT_NOT_FOUND"),
    ),
)
def account_state(user_id: Annotated[int, Path(gt=0, lt=2**31)]) -> dict[str, Any]:
    return operations().account(user_id)


def _signed_amount(text: object) -> Decimal:
    """ "-1.50" takes from the balance, "1.50" adds to it; the digits as every amount's (money.parse_amount)."""
    if isinstance(text, str) and text.startswith("-"):
        return -parse_amount(text[1:])
    return parse_amount(text)


class AdjustmentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: Annotated[
        Decimal,
        PlainValidator(_signed_amount),
        WithJsonSchema(
            {
                "type": "string",
                "pattern": r"^-?[0-9]{1,12}(\.[0-9]{1,3})?$",
                "description": "a signed decimal string in the account's currency, not 0: below 0 takes from the"
                " balance (refused below the threshold as a deduct), above 0 adds to it",
                "examples": ["-1.50"],
            }
        ),
    ]
    reason: Annotated[StrictStr, Field(min_length=1, max_length=500)] = Field(
        description="why, for the operators' log (GET /ops/log)"
    )


class AdjustmentAnswer(BaseModel):
    adjustment_id: str
    user_id: int
    amount: str
    balance: str
    version: int
    mode: str


@router.post(
    "/ops/accounts/<user_id>/adjustments",
    responses=responses(
        200,
        AdjustmentAnswer,
        "adjusted: a ledger entry of type adjustment, durable in the broker (ASYNC) or the DB (SYNC); logged",
        (404, "ACCOUNT_NOT_FOUND"),
        KEY_CONFLICT,
        UNAVAILABLE,
        (402, "INSUFFICIENT_BALANCE: balance - amount would fall below the threshold"),
        (403, "API_CLOSED: an adjustment down on a closed account"),
        (422, "BALANCE_LIMIT; INVALID_AMOUNT"),
    ),
)
def adjust_balance(
    user_id: Annotated[int, Path(gt=0, lt=2**31)],
    request: Annotated[AdjustmentRequest, Body()],
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    currency = currencies().of(user_id)
    kind = KIND_ADJUST_DOWN if request.amount < 0 else KIND_ADJUST_UP
    result = ledger().charge(kind, user_id, minor_in(currency, abs(request.amount)), idempotency_key)
    amount = currency.format(-result.amount if request.amount < 0 else result.amount)
    detail = {"user_id": user_id, "entry_id": str(result.entry_id), "amount": amount, "reason": request.reason}
    logged = operations().record_once(
        f"adjustment:{result.entry_id}", principal_of(router.current_event), "adjustment", detail
    )
    if logged["reason"] != request.reason:  # the key's adjustment was made for another reason: another request
        raise errors.IdempotencyKeyReused("this Idempotency-Key was used for an adjustment with another reason")
    return AdjustmentAnswer(
        adjustment_id=str(result.entry_id),
        user_id=user_id,
        amount=amount,
        balance=currency.format(result.balance),
        version=result.version,
        mode=result.mode,
    ).model_dump()


@router.get("/ops/reconciler", responses=responses(200, list[dict[str, Any]], "each part: its cursor and last run"))
def reconciler_parts() -> list[dict[str, Any]]:
    return operations().reconciler()


@router.get("/ops/log", responses=responses(200, list[dict[str, Any]], "what operators did, newest first"))
def ops_log(limit: Annotated[int, Query(gt=0, le=500)] = 100) -> list[dict[str, Any]]:
    return [
        {
            "id": str(line.log_id),
            "actor": line.actor,
            "action": line.action,
            "detail": line.detail,
            "created_at": line.created_at,
        }
        for line in operations().log(limit)
    ]


RULES = {
    ("GET", "/ops/dead-letters"): only(ADMIN),
    ("POST", "/ops/dead-letters/replay"): only(ADMIN),
    ("GET", "/ops/accounts/<user_id>"): only(ADMIN),
    ("POST", "/ops/accounts/<user_id>/adjustments"): only(ADMIN),
    ("GET", "/ops/reconciler"): only(ADMIN),
    ("GET", "/ops/log"): only(ADMIN),
}
