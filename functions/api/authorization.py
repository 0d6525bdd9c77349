"""Who may call which route: the one place the API decides it.

The caller comes from what API Gateway puts into the request context, by front door (template.yaml, FrontDoor):
behind the REST API, the Lambda authorizer's context (functions/authorizer: {kind, user_id, scopes, expires_at});
behind the HTTP API, the claims its JWT authorizer verified, read into the same context (authorizer.claims). The
token itself is never read here. Three kinds of caller:
- services (scope `service`): the merchant or platform backend: charge any account, send red packets for a sender,
  create and close payment orders, offer to delay queues, and act for any user;
- operators (scope `admin`, or the `admin` group): create and change accounts, create vouchers, dead letters;
- end users (an account id as username): read their own account, orders, inbox and payment orders, grab red
  packets and order vouchers as themselves, pay their own payment orders.
Every route has exactly one rule, declared next to it in its feature's routes module (RULES, collected here;
tests/unit/test_authorization.py holds the table to the routes); a request
without a caller is 401 UNAUTHENTICATED, a caller the rule does not admit 403 FORBIDDEN, before the route runs."""

from __future__ import annotations

import contextvars
import functools
import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from authorizer.claims import InvalidToken, caller_of_claims

from api.rules import ADMIN, SERVICE, HiddenOwner, OwnerOf, Rule  # noqa: F401 (SERVICE, ADMIN: the scopes, named here too)
from hotledger import errors
from hotledger.features import registered

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver
    from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent


@dataclass(frozen=True)
class Caller:
    user_id: int | None  # the account an end user acts as
    scopes: frozenset[str]
    expires_at: int


def caller_of(context: dict[str, Any]) -> Caller | None:
    """The caller from the authorizer context, or None when there is none (no authorizer ran: public routes, or an
    event that did not come through API Gateway)."""
    if not context or "scopes" not in context:
        return None
    user_id = str(context.get("user_id") or "")
    return Caller(
        user_id=int(user_id) if user_id.isdigit() else None,
        scopes=frozenset(str(context["scopes"]).split()),
        expires_at=int(context.get("expires_at") or 0),
    )


# as the Lambda authorizer reads them (the user pool's resource server, the operators' group)
SCOPE_PREFIX = os.environ.get("AUTH_SCOPE_PREFIX", "hotledger/")
ADMIN_GROUP = os.environ.get("AUTH_ADMIN_GROUP", "admin")


def authorizer_context(event: dict[str, Any]) -> dict[str, Any]:
    """{principalId, kind, user_id, scopes, expires_at} of the request's caller, from either front door's event (a
    REST payload v1 or an HTTP API payload v2 event); empty when no authorizer admitted a caller."""
    authorizer = (event.get("requestContext") or {}).get("authorizer")
    if not isinstance(authorizer, dict):
        return {}
    if event.get("version") != "2.0":
        return authorizer
    claims = (authorizer.get("jwt") or {}).get("claims")
    if not isinstance(claims, dict):
        return {}
    try:
        _, caller = caller_of_claims(claims, SCOPE_PREFIX, ADMIN_GROUP)
    except InvalidToken:
        return {}  # verified, but not a token of ours to act on: no caller (401)
    return {"principalId": caller.principal, **caller.context()}


def principal_of(event: BaseProxyEvent) -> str:
    """Who made the request, as the authorizer named them (principalId: the token's subject), for the logs of what
    operators did. `event`: a router's current_event."""
    return str(authorizer_context(event.raw_event).get("principalId") or "unknown")


@functools.cache
def rules() -> dict[tuple[str, str], Rule]:
    """Every route's rule: the API's own description, then each registered feature's (collected on first use: the
    routes modules import this one)."""
    collected: dict[tuple[str, str], Rule] = {
        ("GET", "/openapi.json"): Rule(public=True),
        ("GET", "/swagger"): Rule(public=True),
    }
    for feature in registered():
        if feature.routes:
            collected.update(importlib.import_module(feature.routes).RULES)
    return collected


def admit(rule: Rule, caller: Caller | None, now_s: float) -> OwnerOf | None:
    """Before the request is parsed: raises Unauthenticated without a live caller, Forbidden for a caller the rule
    cannot admit. Returns the owner to compare with an end user's account once the arguments are parsed, if any."""
    if rule.public:
        return None
    if caller is None:
        raise errors.Unauthenticated("send a bearer token: Authorization: Bearer <token>")
    if caller.expires_at <= now_s:  # API Gateway may serve a cached authorization past the token's expiry
        raise errors.Unauthenticated("the token has expired")
    if rule.anyone or caller.scopes & rule.scopes:
        return None
    if rule.owner is None or caller.user_id is None:
        raise errors.Forbidden("this caller may not make this request")
    return rule.owner


def check_owner(owner: OwnerOf, caller: Caller, args: dict[str, Any]) -> None:
    if owner(args) != caller.user_id:
        if isinstance(owner, HiddenOwner):  # an entity found by its id: another user's answers as a missing one
            raise owner.hidden_as(args)
        raise errors.Forbidden("an end user acts only on their own account")


def rule_of(app: ApiGatewayResolver) -> Rule:
    route = app.context["_route"]
    rule = rules().get((route.method, route.path))
    if rule is None:
        # no route matched (the resolver's 404 route, named by the request's path): any caller may learn that;
        # a route of ours without a rule admits no one
        rule = Rule() if any(r is route for r in (*app._static_routes, *app._dynamic_routes)) else Rule(anyone=True)
    return rule


def admit_request(app: ApiGatewayResolver) -> Callable[[dict[str, Any]], None] | None:
    """Before the request is parsed (401 / 403 whatever the body): the caller from the authorizer context, the
    route's rule. Returns the check left for the parsed arguments (an end user's ownership), if any."""
    return admit_caller(rule_of(app), authorizer_context(app.current_event.raw_event))


def admit_caller(rule: Rule, authorizer_context: dict[str, Any]) -> Callable[[dict[str, Any]], None] | None:
    """admit() for the caller in the authorizer context, remembering for this request whether it acts as an end
    user; the check left for the parsed arguments, if any."""
    caller = caller_of(authorizer_context)
    owner = admit(rule, caller, time.time())
    _end_user.set(owner is not None)
    return None if owner is None or caller is None else functools.partial(check_owner, owner, caller)


# whether this request was admitted as an end user acting on their own account (not by a scope)
_end_user: contextvars.ContextVar[bool] = contextvars.ContextVar("end_user", default=False)


def key_scope(scope: str) -> str:
    """The Idempotency-Key scope of this request: end users and backends never share one, so a user can neither take
    a backend's (predictable) keys for the account nor spend that scope's key quota."""
    return f"user:{scope}" if _end_user.get() else scope
