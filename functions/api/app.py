"""API Gateway (REST, proxy) handler: parse and validate, call hotledger.ledger.service, shape the answer."""
from __future__ import annotations

import json
from typing import Annotated

import redis
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Path
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from api import notices, redpackets, responses, vouchers
from hotledger import errors, observability
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.lock import LockUnavailable
from hotledger.dal.redis_store import RedisUnavailable
from api.schemas import (
    AccountCreated, AccountView, AmountRequest, CreateAccountRequest, DeductResult, OrderView, PatchAccountRequest,
    RechargeResult,
)
from hotledger.money import format_minor, parse_minor
from hotledger.runtime import ledger

logger = observability.logger()
metrics = observability.metrics()
app = APIGatewayRestResolver(enable_validation=True)
app.include_router(vouchers.router)
app.include_router(redpackets.router)
app.include_router(notices.router)

IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$",
           description="Retry-safe key: same key and body returns the first answer; another body gets 409"),
]
UserId = Annotated[int, Path(gt=0, lt=2**31)]


_error, _responses = responses.error, responses.responses
_NOT_FOUND = (404, "ACCOUNT_NOT_FOUND")
_CHARGE_CONFLICT = (409, "IDEMPOTENCY_KEY_REUSED: same Idempotency-Key with another body; IDEMPOTENCY_IN_PROGRESS")
_CHARGE_UNAVAILABLE = responses.UNAVAILABLE


def _ledger_body(result) -> dict:
    return {"user_id": result.user_id, "amount": format_minor(result.amount), "balance": format_minor(result.balance),
            "version": result.version, "mode": result.mode}


def _account_body(account) -> dict:
    return AccountView(
        user_id=account.user_id, user_name=account.user_name, balance=format_minor(account.balance),
        version=account.version, threshold=format_minor(account.threshold), deduct_type=account.deduct_type,
        api_open=account.api_open, pending_orders=account.pending_orders,
    ).model_dump()


@app.post("/accounts", status_code=201, responses=_responses(201, AccountCreated, "account created",
                                                               (409, "DUPLICATE_USER_NAME")))
def create_account(request: Annotated[CreateAccountRequest, Body()]) -> dict:
    user_id = ledger().create_account(request.user_name, request.deduct_type, parse_minor(request.threshold, allow_zero=True))
    metrics.add_metric(name="AccountsCreated", unit=MetricUnit.Count, value=1)
    return {"user_id": user_id}


@app.get("/accounts/<user_id>", responses=_responses(200, AccountView, "the account", _NOT_FOUND))
def get_account(user_id: UserId) -> dict:
    return _account_body(ledger().get_account(user_id))


@app.patch("/accounts/<user_id>", responses=_responses(200, AccountView, "the account after the change", _NOT_FOUND,
                                                       (409, "PENDING_ORDERS: switch to SYNC once nothing is pending")))
def patch_account(user_id: UserId, request: Annotated[PatchAccountRequest, Body()]) -> dict:
    threshold = None if request.threshold is None else parse_minor(request.threshold, allow_zero=True)
    return _account_body(ledger().patch_account(user_id, request.deduct_type, threshold, request.api_open))


@app.post("/accounts/<user_id>/recharge", responses=_responses(200, RechargeResult, "recharged", _NOT_FOUND, _CHARGE_CONFLICT,
                                                               _CHARGE_UNAVAILABLE,
                                                               (422, "BALANCE_LIMIT or invalid input")))
def recharge(user_id: UserId, request: Annotated[AmountRequest, Body()], idempotency_key: IdempotencyKey = None) -> dict:
    result = ledger().recharge(user_id, parse_minor(request.amount), idempotency_key)
    metrics.add_metric(name="Recharges", unit=MetricUnit.Count, value=1)
    _log_charge("recharged", result)
    return {"pay_id": str(result.entry_id), **_ledger_body(result)}


@app.post("/accounts/<user_id>/deduct", responses=_responses(
    200, DeductResult, "charged; the order is durable in the broker (ASYNC) or the DB (SYNC)", _NOT_FOUND, _CHARGE_CONFLICT,
    _CHARGE_UNAVAILABLE,
    (402, "INSUFFICIENT_BALANCE: balance - amount would fall below the threshold"), (403, "API_CLOSED")))
def deduct(user_id: UserId, request: Annotated[AmountRequest, Body()], idempotency_key: IdempotencyKey = None) -> dict:
    result = ledger().deduct(user_id, parse_minor(request.amount), idempotency_key)
    metrics.add_metric(name="Deducts", unit=MetricUnit.Count, value=1)
    _log_charge("deducted", result)
    return {"order_id": str(result.entry_id), **_ledger_body(result)}


@app.get("/accounts/<user_id>/orders/<order_id>", responses=_responses(200, OrderView, "the order",
                                                                       (404, "ACCOUNT_NOT_FOUND or ORDER_NOT_FOUND")))
def get_order(user_id: UserId, order_id: Annotated[int, Path(gt=0, lt=2**63)]) -> dict:
    order = ledger().get_deduct(user_id, order_id)
    return OrderView(order_id=str(order.entry_id), user_id=order.user_id, amount=format_minor(order.amount),
                     balance_after=format_minor(order.balance_after), status=order.status).model_dump()


@app.get("/openapi.json", include_in_schema=False)
def openapi_document():
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=openapi_json())


SWAGGER_HTML = """<!doctype html><html><head><title>hotledger API</title>
<link rel="stylesheet" href="https://unpkg.com/swagger-ui-dist@5/swagger-ui.css"></head>
<body><div id="ui"></div><script src="https://unpkg.com/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "openapi.json", dom_id: "#ui"});</script></body></html>"""


@app.get("/swagger", include_in_schema=False)
def swagger_ui():
    return Response(status_code=200, content_type="text/html", body=SWAGGER_HTML)


def openapi_json() -> str:
    """The generated document, with validation failures described as the ErrorResponse we send."""
    doc = json.loads(app.get_openapi_json_schema(title="hotledger", version="1.0.0",
                                                 description="Prepaid balances: Redis Lua hot path, Kafka to MySQL."))
    invalid = {"description": "invalid input (INVALID_AMOUNT, MISSING_FIELD, VALIDATION_ERROR)",
               "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
    malformed = {**invalid, "description": "MALFORMED_JSON: the body is not JSON"}
    not_json = {**invalid, "description": "UNSUPPORTED_MEDIA_TYPE: send Content-Type: application/json"}
    for path in doc["paths"].values():
        for operation in path.values():
            if 422 in operation["responses"] or "422" in operation["responses"]:
                operation["responses"]["422"] = invalid
                if operation.get("requestBody"):
                    operation["responses"]["400"] = malformed
                    operation["responses"]["415"] = not_json
    for unused in ("HTTPValidationError", "ValidationError"):
        doc["components"]["schemas"].pop(unused, None)
    return json.dumps(doc)


def _log_charge(what: str, result) -> None:
    # one line per money movement: with the correlation id it ties a request to its entry id
    logger.info(what, extra={"user_id": result.user_id, "entry_id": str(result.entry_id), "amount_minor": result.amount,
                             "balance_minor": result.balance, "version": result.version, "mode": result.mode})


# errors -------------------------------------------------------------------------------------------
def _count_rejection(code: str) -> None:
    logger.info("rejected", extra={"code": code})
    with single_metric(name="Rejections", unit=MetricUnit.Count, value=1, namespace=metrics.namespace) as metric:
        metric.add_dimension(name="code", value=code)


@app.exception_handler(errors.DomainError)
def domain_error(exc: errors.DomainError) -> Response:
    _count_rejection(exc.code)
    if exc.code == "PUBLISH_FAILED":
        metrics.add_metric(name="PublishFailures", unit=MetricUnit.Count, value=1)
    return _error(exc.status, exc.code, exc.message, **exc.details)


_AMOUNT_FIELDS = {"amount", "threshold", "total"}


@app.exception_handler(RequestValidationError)
def validation_error(exc: RequestValidationError) -> Response:
    content_type = (app.current_event.headers or {}).get("content-type", "application/json")
    if app.current_event.body and "json" not in content_type.lower():
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
        message = f"{field}: a decimal string with at most 2 fractional digits, such as \"12.34\", is required"
    else:
        code, status = "VALIDATION_ERROR", 422
        message = f"{field or 'request'}: {first.get('msg', 'invalid value')}"
    _count_rejection(code)
    return _error(status, code, message)


@app.exception_handler([redis.RedisError, RedisUnavailable, DatabaseUnavailable, LockUnavailable])
def dependency_down(exc: Exception) -> Response:
    logger.warning("dependency unavailable", exc_info=exc)
    _count_rejection("SERVICE_UNAVAILABLE")
    return _error(503, "SERVICE_UNAVAILABLE", "a backing service is unavailable; nothing was changed, retry later")


@app.not_found
def route_not_found(exc: NotFoundError) -> Response:
    return _error(404, "ROUTE_NOT_FOUND", "no such route")


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
@metrics.log_metrics
def handler(event: dict, context) -> dict:
    metrics.add_metric(name="ApiRequests", unit=MetricUnit.Count, value=1)
    return app.resolve(event, context)
