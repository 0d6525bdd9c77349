"""Who the tests act as: unless a test says otherwise, a backend holding both the service and the admin scope
(TRUSTED_SCOPES), as authorizer context for the handler (caller_context, Api) or as a local dev issuer token over HTTP
(token_for)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from abc import ABCMeta

from infra.localrt import events

TRUSTED_SCOPES = ("service", "admin")


def caller_context(user_id: int | None = None, scopes: tuple[str, ...] = TRUSTED_SCOPES, ttl_s: int = 3600) -> dict:
    """requestContext.authorizer as API Gateway passes the authorizer's answer (functions/authorizer) to the API."""
    from infra import dev_issuer

    return dev_issuer.caller_context(user_id, scopes, ttl_s)


_tokens: dict[tuple, tuple[str, float]] = {}


def token_for(user_id: int | None = None, scopes: tuple[str, ...] = TRUSTED_SCOPES) -> str:
    """A local dev issuer token (what `make token` prints), minted again when half its hour is gone."""
    from infra import dev_issuer

    key = (user_id, scopes)
    if key not in _tokens or _tokens[key][1] < time.monotonic() - 1800:
        _tokens[key] = (dev_issuer.token(user_id, scopes), time.monotonic())
    return _tokens[key][0]


TRUSTED = object()  # LocalService.request's default: the TRUSTED_SCOPES token


_per_thread = threading.local()


class _PerThread:
    """One value per thread of a Powertools router attribute (a data descriptor, on the class and its metaclass)."""

    def __init__(self, name: str, default=None):
        self.name, self.default = name, default

    def __get__(self, obj, owner=None):
        if not hasattr(_per_thread, self.name):
            if self.default is None:
                raise AttributeError(self.name)
            setattr(_per_thread, self.name, self.default())
        return getattr(_per_thread, self.name)

    def __set__(self, obj, value):
        setattr(_per_thread, self.name, value)


class _PerThreadRouterMeta(ABCMeta):
    current_event = _PerThread("current_event")
    lambda_context = _PerThread("lambda_context")


def _one_invocation_per_thread() -> None:
    """Lambda runs one invocation at a time per container (and so does the local runtime: a process per worker), and
    Powertools keeps the request in router state shared by the process (BaseRouter.current_event, app.context). The
    tests call the handler from several threads at once: each thread gets its own copy of that state, so requests
    interleave as concurrent containers' do, never reading another's event or route arguments."""
    from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

    if isinstance(BaseRouter, _PerThreadRouterMeta):
        return
    for name, default in (("current_event", None), ("lambda_context", None), ("context", dict)):
        type.__setattr__(BaseRouter, name, _PerThread(name, default))
    BaseRouter.__class__ = _PerThreadRouterMeta


class Api:
    """Calls the API function's handler with API Gateway events of a front door (REST proxy events by default,
    front_door="http": HTTP API payload v2 events behind its JWT authorizer), as the caller given: by default the
    trusted backend; Api(user_id=7, scopes=()) an end user; Api(anonymous=True) no authorizer context at all."""

    def __init__(
        self,
        user_id: int | None = None,
        scopes: tuple[str, ...] = TRUSTED_SCOPES,
        anonymous: bool = False,
        front_door: str = "rest",
    ):
        from api.app import handler

        _one_invocation_per_thread()
        self.handler = handler
        self.user_id, self.scopes, self.anonymous, self.front_door = user_id, scopes, anonymous, front_door

    def event(self, method: str, path: str, text: str | None, headers: dict | None = None, query: str = "") -> dict:
        """The event API Gateway gives the function for this request of this caller, by front door."""
        if self.front_door == "http":
            from infra import dev_issuer

            claims = None if self.anonymous else dev_issuer.jwt_authorizer_context(self.user_id, self.scopes)
            return events.api_gateway_http(method, path, text, headers, query, jwt=claims)
        caller = None if self.anonymous else caller_context(self.user_id, self.scopes)
        return events.api_gateway_proxy(method, path, text, headers, query, authorizer=caller)

    def __call__(self, method: str, path: str, body=None, headers: dict | None = None, raw: str | None = None):
        text = raw if raw is not None else (json.dumps(body) if body is not None else None)
        path, _, query = path.partition("?")
        response = self.handler(self.event(method, path, text, headers, query), events.LambdaContext("ApiFunction"))
        return response["statusCode"], events.json_body(response) if response["body"].startswith(
            ("{", "[")
        ) else response["body"]

    def account(self, name: str | None = None, balance: str | None = None, **fields) -> int:
        status, body = self("POST", "/accounts", {"user_name": name or f"u-{uuid.uuid4().hex[:12]}", **fields})
        assert status == 201, body
        user_id = body["user_id"]
        if balance:
            status, body = self("POST", f"/accounts/{user_id}/recharge", {"amount": balance})
            assert status == 200, body
        return user_id


def voucher(api, stock=5, begin_at=None, end_at=None, **fields) -> int:
    """A voucher created through POST /vouchers (on sale from a second ago for an hour unless told); its id."""
    now = int(time.time() * 1000)
    status, body = api(
        "POST",
        "/vouchers",
        {
            "title": "10 off",
            "stock": stock,
            "begin_at": begin_at or now - 1000,
            "end_at": end_at or now + 3_600_000,
            **fields,
        },
    )
    assert status == 201, body
    return int(body["voucher_id"])
