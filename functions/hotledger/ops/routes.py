"""The operators' console routes (admin scope only): dead letters and their replays, an account as Redis and the DB
hold it, the reconciler's parts, and the log of what operators did. `hotledger ops` (infra/ops.py) calls these."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from api.authorization import principal_of
from api.responses import responses
from api.rules import ADMIN, only
from hotledger.ops.feature import operations
from hotledger.ops.service import SOURCES

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
    ("GET", "/ops/reconciler"): only(ADMIN),
    ("GET", "/ops/log"): only(ADMIN),
}
