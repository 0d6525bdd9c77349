"""The charge routes' one-step validation (api/route_args.py) against Powertools' own request validator, the one every
other request goes through: whatever the step accepts, the validator accepts with the same values; whatever the step
leaves to the validator is refused there or differs in a way the step cannot tell (so every error stays the
validator's)."""

import itertools
import json
from decimal import Decimal

import pytest
from aws_lambda_powertools.event_handler.api_gateway import BaseRouter
from aws_lambda_powertools.event_handler.middlewares.openapi_validation import OpenAPIRequestValidationMiddleware
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestUnsupportedContentType, RequestValidationError

from helpers import caller_context
from infra.localrt import events

USER_IDS = ["5", "05", "0", "-1", "2147483647", "2147483648", "abc", " 5", "5.0"]
KEYS = [None, "k1", "key_1.a:b-c", "", "a b", "x" * 100, "x" * 101, ["k1", "k2"]]
CONTENT_TYPES = [None, "application/json", "application/json; charset=utf-8", "Application/JSON", "text/plain", ""]
BODIES = [
    '{"amount": "1.00"}',
    '{"amount": "0.00"}',
    '{"amount": 1}',
    '{"amount": "1.00", "extra": 1}',
    "null",
    "",
    "not json",
    "[]",
    '{"amount": "1e2"}',
    '{"amount": "999999999999.99"}',
    '{"amount": "12.3"}',
]


def _event(route: str, user_id: str, key, content_type, body: str) -> dict:
    headers = {} if content_type is None else {"Content-Type": content_type}
    event = events.api_gateway_proxy(
        "POST", f"/accounts/{user_id}/{route}", body or None, headers, authorizer=caller_context(None, ("service",))
    )
    if key is not None:
        values = key if isinstance(key, list) else [key]
        event["headers"] = {**(event["headers"] or {}), "Idempotency-Key": values[-1]}
        event["multiValueHeaders"] = {**(event["multiValueHeaders"] or {}), "Idempotency-Key": values}
    return event


def _generic(app, route, event: dict, route_args: dict):
    """The arguments Powertools' validator gives the route, or the error it raises."""
    BaseRouter.current_event = app._to_proxy_event(event)  # where resolve() puts it (the class: every router sees it)
    app.context.clear()
    app.append_context(_route=route, _route_args=dict(route_args))
    try:
        return OpenAPIRequestValidationMiddleware().handler(app, lambda parsed: parsed.context["_route_args"])
    except (RequestValidationError, RequestUnsupportedContentType) as exc:
        return exc
    finally:
        app.context.clear()  # the resolver keeps its context across requests: leave none behind


@pytest.mark.parametrize("route_name", ["deduct", "recharge"])
def test_the_one_step_accepts_only_what_the_validator_accepts_with_the_same_values(route_name):
    from api.app import _rest_lane, app

    route = next(r for r in app._dynamic_routes if r.method == "POST" and r.path == f"/accounts/<user_id>/{route_name}")
    one_step = _rest_lane.hot[id(route)][0]
    taken = set()
    for user_id, key, content_type, body in itertools.product(USER_IDS, KEYS, CONTENT_TYPES, BODIES):
        event = _event(route_name, user_id, key, content_type, body)
        fast = one_step.parse(event, {"user_id": user_id})
        if fast is not None:
            taken.add((user_id, str(key), content_type, body))
            assert fast == _generic(app, route, event, {"user_id": user_id}), (user_id, key, content_type, body)
    # the plain requests take the step
    plain = {
        (user_id, key, content_type, body)
        for user_id in ("5", "2147483647")
        for key in ("None", "k1", "x" * 100)
        for content_type in (None, "application/json", "application/json; charset=utf-8")
        for body in ('{"amount": "1.00"}', '{"amount": "999999999999.99"}')
    }
    assert plain <= taken


def test_a_plain_charge_takes_the_one_step_and_gets_the_validated_values():
    from api.app import _rest_lane, app

    route = next(r for r in app._dynamic_routes if r.path == "/accounts/<user_id>/deduct")
    args = _rest_lane.hot[id(route)][0].parse(
        _event("deduct", "7", "k1", "application/json", json.dumps({"amount": "12.34"})), {"user_id": "7"}
    )
    assert (args["user_id"], args["idempotency_key"], args["request"].amount) == (7, "k1", Decimal("12.34"))
