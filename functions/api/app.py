"""The API function: API Gateway proxy events of either front door (template.yaml, FrontDoor: the HTTP API's payload
v2, the REST API's v1) resolved by the Powertools resolver of that payload format over the routers of the registered
features (hotledger.features: each feature's routes module) and this module's own. Here: the error handlers that turn
domain, validation and dependency failures into the ErrorResponse body, the OpenAPI document and Swagger UI, and
the Lambda handler with its request-scoped logging and metrics."""

from __future__ import annotations

import gc
import importlib
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver, Router
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.middlewares.openapi_validation import OpenAPIRequestValidationMiddleware
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestUnsupportedContentType, RequestValidationError
from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer, SecuritySchemeType
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from api import authorization, responses
from api.hot_lane import HotLane
from hotledger import errors, observability
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.lock import LockUnavailable
from hotledger.dal.redis_store import RedisUnavailable
from hotledger.features import registered

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler.middlewares import NextMiddleware
    from aws_lambda_powertools.utilities.typing import LambdaContext
    from pydantic import JsonValue

logger = observability.logger()
metrics = observability.metrics()
tracer = observability.tracer()


class _AuthorizedJsonBodies(OpenAPIRequestValidationMiddleware):
    """Runs first for every request, a route matched or not (Powertools keeps its request validator here, 3.x):
    who may call (api.authorization: 401 / 403 before the request is parsed, an end user's ownership after), then
    bodies are JSON (absent Content-Type: JSON, as before). Powertools also parses forms and multipart: a multipart
    body without a boundary raised ValueError (a 502), and a parsed form reached the route. Anything else is refused
    with RequestUnsupportedContentType (our 415) before it is parsed."""

    # installed on both resolvers below (their base class is what Powertools' signature names)
    def handler(self, app: ApiGatewayResolver, next_middleware: NextMiddleware) -> Response[Any]:
        owner_check = authorization.admit_request(app)
        if owner_check is not None:

            def owned(parsed: ApiGatewayResolver, route: NextMiddleware = next_middleware) -> Response[Any]:
                owner_check(parsed.context.get("_route_args", {}))
                return route(parsed)

            # Powertools' NextMiddleware protocol declares __name__ a method, which no function matches
            next_middleware = owned  # type: ignore[assignment]
        return super().handler(app, next_middleware)

    def _get_body(self, app: ApiGatewayResolver) -> dict[str, Any]:
        content_type = (app.current_event.headers.get("content-type") or "").strip()
        if content_type and not content_type.lower().startswith("application/json"):
            raise RequestUnsupportedContentType(
                "Unsupported content type",
                errors=[
                    {"type": "unsupported_content_type", "loc": ("body",), "msg": "send JSON", "input": {}, "ctx": {}}
                ],
            )
        return super()._get_body(app)


# the API's own routes and error handlers, included after the features' routers into each resolver
router = Router()
_error = responses.error


@router.get("/openapi.json", include_in_schema=False)
def openapi_document() -> Response[str]:
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=openapi_json())


SWAGGER_HTML = """<!doctype html><html><head><title>hotledger API</title>
<link rel="stylesheet" href="https://unpkg.com/swagger-ui-dist@5/swagger-ui.css"></head>
<body><div id="ui"></div><script src="https://unpkg.com/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "openapi.json", dom_id: "#ui"});</script></body></html>"""


@router.get("/swagger", include_in_schema=False)
def swagger_ui() -> Response[str]:
    return Response(status_code=200, content_type="text/html", body=SWAGGER_HTML)


def openapi_json() -> str:
    """The generated document, with validation failures described as the ErrorResponse we send."""
    doc = json.loads(
        app.get_openapi_json_schema(
            title="hotledger",
            version="1.0.0",
            description="Prepaid balances: Redis Lua hot path, Kafka to MySQL.",
            security_schemes={
                "bearer": HTTPBearer(
                    type_=SecuritySchemeType.http,
                    scheme="bearer",
                    bearerFormat="JWT",
                    description="a Cognito (or local dev issuer) ID or access token",
                )
            },
            security=[{"bearer": []}],
        )
    )
    invalid = {
        "description": "invalid input (INVALID_AMOUNT, MISSING_FIELD, VALIDATION_ERROR)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
    malformed = {**invalid, "description": "MALFORMED_JSON: the body is not JSON"}
    not_json = {**invalid, "description": "UNSUPPORTED_MEDIA_TYPE: send Content-Type: application/json"}
    unauthenticated = {**invalid, "description": "UNAUTHENTICATED: no token, or an invalid or expired one"}
    for path in doc["paths"].values():
        for operation in path.values():
            operation["responses"]["401"] = unauthenticated
            denied = operation["responses"].get("403", {}).get("description")
            operation["responses"]["403"] = {
                **invalid,
                "description": "FORBIDDEN: this caller may not make this request" + (f"; {denied}" if denied else ""),
            }
            if 422 in operation["responses"] or "422" in operation["responses"]:
                own = (operation["responses"].get("422") or operation["responses"].get(422) or {}).get("description")
                operation["responses"]["422"] = (
                    {**invalid, "description": f"{own}; {invalid['description']}"}
                    if own and own not in ("Unprocessable Entity", "Validation Error") and "VALIDATION_ERROR" not in own
                    else invalid
                )
                if operation.get("requestBody"):
                    operation["responses"]["400"] = malformed
                    operation["responses"]["415"] = not_json
    doc["webhooks"] = {
        name: item
        for feature in registered()
        if feature.routes
        for name, item in getattr(importlib.import_module(feature.routes), "OPENAPI_WEBHOOKS", {}).items()
    }
    for unused in ("HTTPValidationError", "ValidationError"):
        doc["components"]["schemas"].pop(unused, None)
    return json.dumps(_exact_bounds(doc))


_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}


def _exact_bounds(node: JsonValue) -> JsonValue:
    """The generator writes integer bounds as floats (9.223372036854776e+18 for 2**63): a client comparing against
    the float takes 9223372036854775998 for valid. Every bound here is an integer (2**63 and 2**31 are exact
    doubles), so it is written as one."""
    if isinstance(node, dict):
        return {
            k: int(v) if k in _BOUNDS and isinstance(v, float) and v.is_integer() else _exact_bounds(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_exact_bounds(v) for v in node]
    return node


# errors -------------------------------------------------------------------------------------------
# (Powertools' exception_handler has no return annotation: --strict takes each handler it decorates for untyped)
def _count_rejection(code: str) -> None:
    logger.info("rejected", extra={"code": code})
    with single_metric(name="Rejections", unit=MetricUnit.Count, value=1, namespace=metrics.namespace) as metric:
        metric.add_dimension(name="code", value=code)


@router.exception_handler(errors.DomainError)  # type: ignore[untyped-decorator]
def domain_error(exc: errors.DomainError) -> Response[str]:
    _count_rejection(exc.code)
    if exc.code == "PUBLISH_FAILED":
        metrics.add_metric(name="PublishFailures", unit=MetricUnit.Count, value=1)
    return _error(exc.status, exc.code, exc.message, **exc.details)


_AMOUNT_FIELDS = {"amount", "threshold", "total", "below", "above", "rearm_above", "rearm_below"}


@router.exception_handler(RequestUnsupportedContentType)  # type: ignore[untyped-decorator]
def unsupported_content_type(exc: RequestUnsupportedContentType) -> Response[str]:
    _count_rejection("UNSUPPORTED_MEDIA_TYPE")
    return _error(415, "UNSUPPORTED_MEDIA_TYPE", "send the body as JSON with Content-Type: application/json")


@router.exception_handler(RequestValidationError)  # type: ignore[untyped-decorator]
def validation_error(exc: RequestValidationError) -> Response[str]:
    content_type = (router.current_event.headers or {}).get("content-type", "application/json")
    if router.current_event.body and "json" not in content_type.lower():
        _count_rejection("UNSUPPORTED_MEDIA_TYPE")
        return _error(415, "UNSUPPORTED_MEDIA_TYPE", "send the body as JSON with Content-Type: application/json")
    problems = exc.errors()
    first = problems[0] if problems else {"type": "value_error", "loc": (), "msg": "invalid request"}
    field = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    if first["type"] == "json_invalid":
        code, status, message = "MALFORMED_JSON", 400, "the request body is not valid JSON"
    elif first["type"] == "missing":
        code, status, message = "MISSING_FIELD", 422, f"{field} is required"
    elif _AMOUNT_FIELDS & {str(part) for part in first.get("loc", ())}:
        code, status = "INVALID_AMOUNT", 422
        message = (
            f"{field}: a decimal string with at most as many fractional digits as the account's currency has (JPY 0,"
            ' USD 2, KWD 3), such as "12.34", is required'
        )
    else:
        code, status = "VALIDATION_ERROR", 422
        message = f"{field or 'request'}: {first.get('msg', 'invalid value')}"
    _count_rejection(code)
    return _error(status, code, message)


@router.exception_handler([RedisUnavailable, DatabaseUnavailable, LockUnavailable])  # type: ignore[untyped-decorator]
def dependency_down(exc: Exception) -> Response[str]:
    """A command or COMMIT whose answer was lost (responses.ANSWER_LOST) may have run: "nothing was changed" would be
    a lie, unless the request is a read (GET, HEAD), which changes nothing whatever its commands did."""
    if isinstance(exc, responses.ANSWER_LOST) and router.current_event.http_method.upper() not in ("GET", "HEAD"):
        logger.warning("dependency answer lost", exc_info=exc)
        _count_rejection("OUTCOME_UNKNOWN")
        return _error(
            503,
            "OUTCOME_UNKNOWN",
            "a backing service did not answer after the request reached it: the change may have been made; read the "
            "resource before retrying",
        )
    logger.warning("dependency unavailable", exc_info=exc)
    _count_rejection("SERVICE_UNAVAILABLE")
    return _error(503, "SERVICE_UNAVAILABLE", "a backing service is unavailable; nothing was changed, retry later")


@router.exception_handler(NotFoundError)  # type: ignore[untyped-decorator]
def route_not_found(exc: NotFoundError) -> Response[str]:
    path = router.current_event.path
    allowed = sorted({route.method for route in app._static_routes + app._dynamic_routes if route.rule.match(path)})
    if allowed:
        response = _error(
            405,
            "METHOD_NOT_ALLOWED",
            f"{router.current_event.http_method} is not a method of this route; use {', '.join(allowed)}",
        )
        response.headers["Allow"] = ", ".join(allowed)
        return response
    return _error(404, "ROUTE_NOT_FOUND", "no such route")


def _resolver(resolver: ApiGatewayResolver) -> tuple[ApiGatewayResolver, HotLane]:
    """`resolver` over every feature's routes and this module's, and its lane for the hot routes (every charge:
    answered by the lane when the request is plain, api/hot_lane.py)."""
    # Powertools' OpenAPIRequestValidationMiddleware.__init__ has no annotations (an untyped call under --strict only)
    resolver._request_validation_middleware = _AuthorizedJsonBodies()  # type: ignore[no-untyped-call]
    hot_paths: set[tuple[str, str]] = set()
    for feature in registered():  # the ledger first: the hot routes (deduct, recharge) are matched before the others
        if feature.routes:
            routes_module = importlib.import_module(feature.routes)
            resolver.include_router(routes_module.router)
            hot_paths |= getattr(routes_module, "HOT_ROUTES", set())
    resolver.include_router(router)
    return resolver, HotLane(resolver, hot_paths)


app, _rest_lane = _resolver(APIGatewayRestResolver(enable_validation=True))  # REST API: payload v1
http_app, _http_lane = _resolver(APIGatewayHttpResolver(enable_validation=True))  # HTTP API: payload v2
# one request context for both: a router reads its last resolver's (include_router), whichever resolver runs
http_app.context = app.context


def resolve_request(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # API Gateway's request id is the correlation id: read directly, not through a JMESPath query per request
    logger.set_correlation_id((event.get("requestContext") or {}).get("requestId"))
    metrics.add_metric(name="ApiRequests", unit=MetricUnit.Count, value=1)
    if event.get("version") == "2.0":
        return _http_lane.answer(event, context) or http_app.resolve(event, context)
    return _rest_lane.answer(event, context) or app.resolve(event, context)


_traced: Callable[[dict[str, Any], LambdaContext], dict[str, Any]] = tracer.capture_lambda_handler(resolve_request)
_first_invocation = True


@observability.invocation(logger, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # X-Ray keeps only sampled traces (the default rule: one a second, then 5%): the subsegments of an unsampled
    # invocation are never sent, so it skips building them. The first invocation is traced whatever its header, for
    # its ColdStart annotation.
    global _first_invocation
    if _first_invocation or "Sampled=0" not in os.environ.get("_X_AMZN_TRACE_ID", ""):
        _first_invocation = False
        return _traced(event, context)
    return resolve_request(event, context)


# what the imports built lives as long as the container: the cyclic collector, which the requests' allocations set
# off, need not walk it again each time (https://docs.python.org/3/library/gc.html#gc.freeze)
gc.freeze()
