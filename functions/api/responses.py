"""Answer shapes shared by the API's routers: the error body and the OpenAPI response table."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.event_handler import Response, content_types

from api.schemas import ErrorResponse
from hotledger.dal.db import CommitOutcomeUnknown
from hotledger.dal.redis_store import RedisOutcomeUnknown

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse

# a backing service's failures after the request reached it (its answer was lost): the change may have been made, so
# the API answers 503 OUTCOME_UNKNOWN, not SERVICE_UNAVAILABLE, and an Idempotency-Key stays in flight
ANSWER_LOST = (RedisOutcomeUnknown, CommitOutcomeUnknown)


def error(status: int, code: str, message: str, **details: str) -> Response[str]:
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps({"error": {"code": code, "message": message, **details}}),
    )


# json.dumps with any option builds its encoder per call
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def json_answer(body: dict[str, Any], status: int = 200) -> Response[str]:
    """A JSON answer serialized as the resolver would (compact separators), for routes that serialize it themselves."""
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=_COMPACT.encode(body))


def responses(ok_status: int, ok_model: object, ok_text: str, *errors_: tuple[int, str]) -> dict[int, OpenAPIResponse]:
    """ok_model: what the answer's body is (a model, dict, list[X], ...; the OpenAPI table takes any type)."""
    answers: dict[int, OpenAPIResponse] = {
        ok_status: {"description": ok_text, "content": {"application/json": {"model": ok_model}}}
        if ok_model is not None
        else {"description": ok_text}
    }  # None: no body (a 204)
    for status, text in (
        (
            503,
            "SERVICE_UNAVAILABLE: Redis, the DB or the broker is unavailable; nothing was changed. OUTCOME_UNKNOWN: "
            "Redis or the DB did not answer after the request reached it; the change may have been made, read the "
            "resource before retrying",
        ),
        *errors_,
    ):
        answers[status] = {"description": text, "content": {"application/json": {"model": ErrorResponse}}}
    return answers


UNAVAILABLE = (
    503,
    "SERVICE_UNAVAILABLE or PUBLISH_FAILED: nothing was changed, retry; OUTCOME_UNKNOWN: the broker "
    "did not acknowledge and Redis could not undo the change, look it up (error.entry_id) before retrying",
)
