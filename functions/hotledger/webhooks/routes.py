"""Webhook endpoint routes: register, read, change, rotate the secret, remove; deliveries and replays."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Path, Query
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from api.authorization import authorizer_context, caller_of, principal_of
from api.idempotency import TOO_MANY_KEYS, once
from api.responses import responses
from api.rules import ADMIN, SERVICE, only
from hotledger.ops.feature import operations
from hotledger.webhooks.events import BALANCE_TYPES, EVENT_TYPES, MEANING, BalanceEvent, EntryEvent
from hotledger.webhooks.feature import webhooks
from hotledger.webhooks.service import (
    REPLAY_PAGE,
    REPLAY_PAGE_MAX,
    ROTATION_OVERLAP_S,
    SEND_TIMEOUT_S,
    Delivery,
    Endpoint,
)

router = Router()
EndpointKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Retry-safe key, scoped to the caller: the first answer (the endpoint and its secret, or a refusal) "
        "is replayed for the same key and body for 24 h (kept in Redis only) and the endpoint is created once. Another "
        "body gets 409 IDEMPOTENCY_KEY_REUSED, a retry while the first is in flight 409 IDEMPOTENCY_IN_PROGRESS.",
    ),
]
EndpointId = Annotated[int, Path(gt=0, lt=2**63)]
_NOT_FOUND = (404, "WEBHOOK_ENDPOINT_NOT_FOUND")
_BAD = (
    422,
    "INVALID_WEBHOOK_URL: not https, a character a request cannot carry (non-ASCII, space, control: percent-encode), or"
    " a private, loopback, link-local or metadata address; VALIDATION_ERROR",
)
Url = Annotated[StrictStr, Field(min_length=8, max_length=2048)]
Types = Annotated[list[StrictStr], Field(min_length=1, max_length=32)]


class EndpointRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: Url
    event_types: Types = Field(description="what to receive; see the document's `webhooks` section for each type")
    description: Annotated[StrictStr, Field(max_length=500)] = ""


class EndpointPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: Url | None = None
    event_types: Types | None = None
    description: Annotated[StrictStr, Field(max_length=500)] | None = None
    enabled: StrictBool | None = None


class RotateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    overlap_s: Annotated[StrictInt, Field(ge=0, le=7 * 86_400)] = ROTATION_OVERLAP_S


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    since_seq: Annotated[StrictInt, Field(gt=0)] | None = Field(
        None, description="with user_id only (seqs of different accounts do not compare): that account's from this seq"
    )
    since: Annotated[StrictInt, Field(ge=0)] | None = Field(None, description="epoch ms: events booked since then")
    user_id: Annotated[StrictInt, Field(gt=0, lt=2**31)] | None = Field(None, description="one account's events only")
    limit: Annotated[StrictInt, Field(gt=0, le=REPLAY_PAGE_MAX)] = Field(
        REPLAY_PAGE, description="deliveries this call looks at (in account, seq order), at most"
    )
    after: Annotated[StrictStr, Field(pattern=r"^\d{1,10}\.\d{1,19}\.\d{1,3}$")] | None = Field(
        None, description="the previous answer's next_after: go on from there (the same filters)"
    )

    @model_validator(mode="after")
    def _one_account_for_seqs(self) -> ReplayRequest:
        if self.since_seq is not None and self.user_id is None:
            raise ValueError("since_seq needs user_id: seqs of different accounts do not compare")
        return self


class ReplayAnswer(BaseModel):
    replayed: int = Field(description="deliveries of this page sent again (due now, in order; 3 days of retries)")
    next_after: str | None = Field(
        description="null: the replay is done; else send the same request with `after` set to it for the next page"
    )


class EndpointView(BaseModel):
    endpoint_id: str
    url: str
    event_types: list[str]
    description: str
    enabled: bool
    failing: bool = Field(description="an event was dead-lettered after 3 days of retries")
    owner: str = Field(
        description="operator (created by an operator: only operators change it) or service (services and operators)"
    )
    secret: str | None = Field(None, description="whsec_<base64>: in the answer to create and rotate-secret only")


class DeliveryView(BaseModel):
    event_id: str
    type: str
    user_id: int
    seq: int
    prev_seq: int | None
    state: str = Field(description="PENDING, DELIVERED or DEAD")
    attempts: int
    last_status: int | None
    last_error: str | None
    next_attempt_at: int
    created_at: int
    delivered_at: int | None
    cursor: str = Field(description="its place in the listing: `before` in the next page's request")


def _view(e: Endpoint, secret: str | None = None) -> dict[str, Any]:
    return {
        "endpoint_id": str(e.endpoint_id),
        "url": e.url,
        "event_types": list(e.event_types),
        "description": e.description,
        "enabled": e.enabled,
        "failing": e.failing,
        "owner": "operator" if e.operator_owned else "service",
        **({"secret": secret} if secret else {}),
    }


def _delivery(d: Delivery) -> dict[str, Any]:
    return {
        "event_id": d.event_id,
        "type": d.type,
        "user_id": d.user_id,
        "seq": d.seq,
        "prev_seq": d.prev_seq,
        "state": d.state,
        "attempts": d.attempts,
        "last_status": d.last_status,
        "last_error": d.last_error,
        "next_attempt_at": d.next_attempt_at,
        "created_at": d.created_at,
        "delivered_at": d.delivered_at,
        "cursor": d.cursor,
    }


def _caller() -> tuple[str, bool]:
    """Who calls (the token's subject, for the operators' log) and whether as an operator (the admin scope)."""
    event = router.current_event
    caller = caller_of(authorizer_context(event.raw_event))
    return principal_of(event), bool(caller and ADMIN in caller.scopes)


def _log(actor: str, action: str, endpoint_id: int, **detail: Any) -> None:
    """A change of an endpoint in the operators' log (t_ops_log), never a secret."""
    operations().record(actor, f"{action}.webhook-endpoint", {"endpoint_id": str(endpoint_id), **detail})


_FORBIDDEN = (403, "a service caller changing an endpoint an operator created (only operators change those)")


_LIMIT = (409, "WEBHOOK_ENDPOINT_LIMIT: WEBHOOK_MAX_ENDPOINTS (16) endpoints live already; IDEMPOTENCY_KEY_REUSED")


@router.post(
    "/webhook-endpoints",
    status_code=201,
    responses=responses(201, EndpointView, "registered, with its secret", _BAD, _LIMIT, TOO_MANY_KEYS),
)
def create_endpoint(request: Annotated[EndpointRequest, Body()], idempotency_key: EndpointKey = None) -> Response[str]:
    actor, operator = _caller()

    def run() -> dict[str, Any]:
        endpoint, secret = webhooks().create(request.url, request.event_types, request.description, operator, actor)
        owner = "operator" if operator else "service"
        _log(
            actor, "create", endpoint.endpoint_id, url=endpoint.url, event_types=list(endpoint.event_types), owner=owner
        )
        return _view(endpoint, secret)

    # scoped to the caller (the token's subject); the answer, secret included, is replayed from Redis for 24 h
    return once(
        f"webhook-endpoints:{actor}", idempotency_key, "POST /webhook-endpoints", request.model_dump(), run, 201
    )


@router.get("/webhook-endpoints", responses=responses(200, list[EndpointView], "every endpoint"))
def list_endpoints() -> list[dict[str, Any]]:
    return [_view(e) for e in webhooks().endpoints()]


@router.get("/webhook-endpoints/<endpoint_id>", responses=responses(200, EndpointView, "the endpoint", _NOT_FOUND))
def get_endpoint(endpoint_id: EndpointId) -> dict[str, Any]:
    return _view(webhooks().get(endpoint_id))


@router.patch(
    "/webhook-endpoints/<endpoint_id>",
    responses=responses(200, EndpointView, "changed", _NOT_FOUND, _BAD, _FORBIDDEN),
)
def patch_endpoint(endpoint_id: EndpointId, request: Annotated[EndpointPatch, Body()]) -> dict[str, Any]:
    actor, operator = _caller()
    webhooks().changeable(endpoint_id, operator)
    changed = webhooks().update(endpoint_id, request.url, request.event_types, request.description, request.enabled)
    _log(actor, "update", endpoint_id, **request.model_dump(exclude_none=True))
    return _view(changed)


@router.post(
    "/webhook-endpoints/<endpoint_id>/rotate-secret",
    responses=responses(
        200, EndpointView, "the new secret; the old one signs too until the overlap ends", _NOT_FOUND, _FORBIDDEN
    ),
)
def rotate_secret(endpoint_id: EndpointId, request: Annotated[RotateRequest, Body()]) -> dict[str, Any]:
    actor, operator = _caller()
    webhooks().changeable(endpoint_id, operator)
    secret = webhooks().rotate(endpoint_id, request.overlap_s)
    _log(actor, "rotate-secret", endpoint_id, overlap_s=request.overlap_s)
    return _view(webhooks().get(endpoint_id), secret)


# no return annotation: Powertools makes it the answer's schema (a 204 has none; the OpenAPI document would change)
@router.delete("/webhook-endpoints/<endpoint_id>", responses=responses(204, None, "removed", _NOT_FOUND, _FORBIDDEN))
def delete_endpoint(endpoint_id: EndpointId):  # type: ignore[no-untyped-def]
    actor, operator = _caller()
    webhooks().changeable(endpoint_id, operator)
    webhooks().delete(endpoint_id)
    _log(actor, "delete", endpoint_id)
    return Response(status_code=204, body="")


@router.get(
    "/webhook-endpoints/<endpoint_id>/deliveries",
    responses=responses(
        200,
        list[DeliveryView],
        "a page of the endpoint's deliveries, newest first (`before`: the next page)",
        _NOT_FOUND,
    ),
)
def list_deliveries(
    endpoint_id: EndpointId,
    state: Annotated[str | None, Query(pattern="^(PENDING|DELIVERED|DEAD)$")] = None,
    limit: Annotated[int, Query(gt=0, le=500)] = 100,
    before: Annotated[
        str | None,
        Query(pattern=r"^\d{1,15}\.\d{1,10}\.\d{1,19}\.\d{1,3}$", description="a delivery's cursor: the page after it"),
    ] = None,
) -> list[dict[str, Any]]:
    after = None
    if before:
        created_at, user_id, seq, sub_seq = (int(part) for part in before.split("."))
        after = (created_at, user_id, seq, sub_seq)
    return [_delivery(d) for d in webhooks().deliveries(endpoint_id, state, limit, after)]


@router.post(
    "/webhook-endpoints/<endpoint_id>/replay",
    responses=responses(
        200,
        ReplayAnswer,
        "one page: how many deliveries are sent again, and where the next page starts",
        _NOT_FOUND,
        _FORBIDDEN,
    ),
)
def replay(endpoint_id: EndpointId, request: Annotated[ReplayRequest, Body()]) -> dict[str, Any]:
    actor, operator = _caller()
    webhooks().changeable(endpoint_id, operator)
    after = None
    if request.after:
        user_id, seq, sub_seq = (int(part) for part in request.after.split("."))
        after = (user_id, seq, sub_seq)
    replayed, last = webhooks().replay(
        endpoint_id, request.since_seq, request.since, request.user_id, after, request.limit
    )
    next_after = ".".join(str(part) for part in last) if last else None
    _log(
        actor, "replay", endpoint_id, **request.model_dump(exclude_none=True), replayed=replayed, next_after=next_after
    )
    return {"replayed": replayed, "next_after": next_after}


DELIVERY = (
    "Signed per Standard Webhooks 1.0: `webhook-id` (the event_id), `webhook-timestamp` (unix seconds) and "
    '`webhook-signature` (`v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">` with the endpoint\'s `whsec_` secret; '
    "two space-separated signatures while a rotated secret overlaps): verify with any Standard Webhooks library, with a "
    "5-minute tolerance. Sent only once the change is durable in the DB, and for every such change of a subscribed type; "
    "in order per account per endpoint (`seq`, `prev_seq`: a gap is visible), at least once (de-duplicate on "
    f"`event_id`). Any 2xx answer acknowledges; anything else, or no status and headers within {SEND_TIMEOUT_S:g} s of "
    "the attempt's start (one deadline for the whole attempt), is retried with exponential backoff and jitter for 3 "
    "days (a 429's or 503's `Retry-After` honoured: never sooner), later events of that account waiting behind it; "
    "then the event is dead-lettered and the endpoint flagged `failing` (operators replay it). A 410 disables the "
    "endpoint: its events wait and go out once it is enabled again."
)
_HEADERS = [
    {"name": name, "in": "header", "required": True, "schema": {"type": "string"}, "description": text}
    for name, text in (
        ("webhook-id", "the event_id"),
        ("webhook-timestamp", "unix seconds of this attempt"),
        ("webhook-signature", "v1,<base64 signature>[ v1,<base64 signature>]"),
    )
]


def _webhook(event_type: str, model: type[BaseModel]) -> dict[str, Any]:
    return {
        "post": {
            "summary": f"{event_type}: {MEANING[event_type]}",
            "description": DELIVERY,
            "parameters": _HEADERS,
            "requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}},
            "responses": {"2XX": {"description": "received: not sent again"}},
        }
    }


# the OpenAPI document's `webhooks` section: what an endpoint receives, per event type (api/app.py adds it)
OPENAPI_WEBHOOKS = {
    **{t: _webhook(t, EntryEvent) for t in EVENT_TYPES.values()},
    **{t: _webhook(t, BalanceEvent) for t in BALANCE_TYPES.values()},
}

# operators and services manage endpoints; end users none. An endpoint an operator created is changed (PATCH,
# rotate-secret, DELETE, replay) by operators only (Webhooks.changeable): services read it
RULES = {
    ("POST", "/webhook-endpoints"): only(SERVICE, ADMIN),
    ("GET", "/webhook-endpoints"): only(SERVICE, ADMIN),
    ("GET", "/webhook-endpoints/<endpoint_id>"): only(SERVICE, ADMIN),
    ("PATCH", "/webhook-endpoints/<endpoint_id>"): only(SERVICE, ADMIN),
    ("POST", "/webhook-endpoints/<endpoint_id>/rotate-secret"): only(SERVICE, ADMIN),
    ("DELETE", "/webhook-endpoints/<endpoint_id>"): only(SERVICE, ADMIN),
    ("GET", "/webhook-endpoints/<endpoint_id>/deliveries"): only(SERVICE, ADMIN),
    ("POST", "/webhook-endpoints/<endpoint_id>/replay"): only(SERVICE, ADMIN),
}
