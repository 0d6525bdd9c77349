"""Account routes: create, read and change accounts, charge them (deduct, recharge), read orders.

Amounts arrive as exact Decimals (api.schemas.Amount / Threshold) and become the account's minor units through its
currency (runtime.currencies: the one rule); answers show them with the currency's digits."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from aws_lambda_powertools.metrics import MetricUnit

from api.idempotency import IdempotencyKey
from api.responses import UNAVAILABLE, json_answer, responses
from api.rules import ADMIN, SERVICE, only, path_arg
from api.schemas import (
    AccountCreated,
    AccountView,
    AmountRequest,
    CreateAccountRequest,
    DeductResult,
    GrantView,
    OrderView,
    PatchAccountRequest,
    RechargeRequest,
    RechargeResult,
)
from hotledger import observability
from hotledger.currencies.service import minor_in
from hotledger.grants.feature import grants
from hotledger.grants.rows import GrantCredit
from hotledger.ledger.feature import ledger
from hotledger.ledger.service import Account, LedgerResult
from hotledger.money import Currency
from hotledger.runtime import currencies

router = Router()
logger = observability.logger()
metrics = observability.metrics()

UserId = Annotated[int, Path(gt=0, lt=2**31)]
_NOT_FOUND = (404, "ACCOUNT_NOT_FOUND")
_CHARGE_CONFLICT = (409, "IDEMPOTENCY_KEY_REUSED: same Idempotency-Key with another body; IDEMPOTENCY_IN_PROGRESS")


def _charged(id_field: str, result: LedgerResult, currency: Currency) -> Response[str]:
    """A charge's answer (DeductResult / RechargeResult), serialized once, here. The hot routes return this Response,
    annotated as one: a dict would be validated against the annotation, dumped by pydantic and then serialized again
    by the resolver, on every deduct (the resolver only checks the body is a str)."""
    return json_answer(
        {
            id_field: str(result.entry_id),
            "user_id": result.user_id,
            "amount": currency.format(result.amount),
            "balance": currency.format(result.balance),
            "version": result.version,
            "mode": result.mode,
        }
    )


def _account_body(account: Account) -> dict[str, Any]:
    currency = currencies().of(account.user_id)
    format_minor = currency.format
    return AccountView(
        user_id=account.user_id,
        user_name=account.user_name,
        currency=currency.code,
        balance=format_minor(account.balance),
        version=account.version,
        threshold=format_minor(account.threshold),
        deduct_type=account.deduct_type,
        api_open=account.api_open,
        pending_orders=account.pending_orders,
        held_credits=format_minor(account.held_credits),
        held=format_minor(account.held),
        available=format_minor(account.available),
        grants=[
            GrantView(
                grant_id=str(g.grant_id),
                remaining=format_minor(g.remaining),
                expires_at=g.expires_at,
                category=g.category,
            )
            for g in account.grants
        ],
    ).model_dump()


_BACKLOG = (
    429,
    "TOO_MANY_PENDING: the account's charges are not reaching the DB; TOO_MANY_KEYS: the account opened "
    "its most new Idempotency-Keys this window (MAX_IDEMPOTENCY_KEYS per 24 h). Nothing was changed, retry later",
)


@router.post(
    "/accounts",
    status_code=201,
    responses=responses(
        201,
        AccountCreated,
        "account created",
        (409, "DUPLICATE_USER_NAME"),
        (422, "INVALID_AMOUNT: the threshold has more fractional digits than the currency"),
    ),
)
def create_account(request: Annotated[CreateAccountRequest, Body()]) -> dict[str, Any]:
    code = request.currency or currencies().default.code
    threshold = minor_in(Currency.of(code), request.threshold, "threshold")
    user_id = ledger().create_account(request.user_name, request.deduct_type, threshold, code)
    currencies().created(user_id, code)
    metrics.add_metric(name="AccountsCreated", unit=MetricUnit.Count, value=1)
    return {"user_id": user_id}


@router.get("/accounts/<user_id>", responses=responses(200, AccountView, "the account", _NOT_FOUND))
def get_account(user_id: UserId) -> dict[str, Any]:
    return _account_body(ledger().get_account(user_id))


@router.patch(
    "/accounts/<user_id>",
    responses=responses(
        200,
        AccountView,
        "the account after the change",
        _NOT_FOUND,
        (409, "PENDING_ORDERS: switch to SYNC once nothing is pending"),
    ),
)
def patch_account(user_id: UserId, request: Annotated[PatchAccountRequest, Body()]) -> dict[str, Any]:
    threshold = None if request.threshold is None else currencies().minor(user_id, request.threshold, "threshold")
    return _account_body(ledger().patch_account(user_id, request.deduct_type, threshold, request.api_open))


@router.post(
    "/accounts/<user_id>/recharge",
    responses=responses(
        200,
        RechargeResult,
        "recharged",
        _NOT_FOUND,
        _CHARGE_CONFLICT,
        UNAVAILABLE,
        (
            422,
            "BALANCE_LIMIT; INVALID_AMOUNT: more fractional digits than the account's currency has; INVALID_GRANT: "
            "grant.expires_at not in the future",
        ),
        _BACKLOG,
    ),
)
def recharge(
    user_id: UserId, request: Annotated[RechargeRequest, Body()], idempotency_key: IdempotencyKey = None
) -> Response[str]:
    currency = currencies().of(user_id)
    grant = None if request.grant is None else GrantCredit(request.grant.expires_at, request.grant.category)
    result = ledger().recharge(user_id, minor_in(currency, request.amount), idempotency_key, grant)
    if grant is not None:
        grants().schedule_expiry(user_id, result.entry_id, grant.expires_at)
    metrics.add_metric(name="Recharges", unit=MetricUnit.Count, value=1)
    _log_charge("recharged", result)
    return _charged("pay_id", result, currency)


@router.post(
    "/accounts/<user_id>/deduct",
    responses=responses(
        200,
        DeductResult,
        "charged; the order is durable in the broker (ASYNC) or the DB (SYNC)",
        _NOT_FOUND,
        _CHARGE_CONFLICT,
        UNAVAILABLE,
        (402, "INSUFFICIENT_BALANCE: balance - amount would fall below the threshold"),
        (403, "API_CLOSED"),
        (422, "INVALID_AMOUNT: more fractional digits than the account's currency has"),
        _BACKLOG,
    ),
)
def deduct(
    user_id: UserId, request: Annotated[AmountRequest, Body()], idempotency_key: IdempotencyKey = None
) -> Response[str]:
    currency = currencies().of(user_id)
    result = ledger().deduct(user_id, minor_in(currency, request.amount), idempotency_key)
    metrics.add_metric(name="Deducts", unit=MetricUnit.Count, value=1)
    _log_charge("deducted", result)
    return _charged("order_id", result, currency)


@router.get(
    "/accounts/<user_id>/orders/<order_id>",
    responses=responses(200, OrderView, "the order", (404, "ACCOUNT_NOT_FOUND or ORDER_NOT_FOUND")),
)
def get_order(user_id: UserId, order_id: Annotated[int, Path(gt=0, lt=2**63)]) -> dict[str, Any]:
    order = ledger().get_deduct(user_id, order_id)
    format_minor = currencies().of(user_id).format
    return OrderView(
        order_id=str(order.entry_id),
        user_id=order.user_id,
        amount=format_minor(order.amount),
        balance_after=format_minor(order.balance_after),
        status=order.status,
    ).model_dump()


def _log_charge(what: str, result: LedgerResult) -> None:
    # one line per money movement: with the correlation id it ties a request to its entry id
    logger.info(
        what,
        extra={
            "user_id": result.user_id,
            "entry_id": str(result.entry_id),
            "amount_minor": result.amount,
            "balance_minor": result.balance,
            "version": result.version,
            "mode": result.mode,
        },
    )


# the routes every charge takes: their path, header and body validated in one precompiled step (api/route_args.py)
HOT_ROUTES = {("POST", "/accounts/<user_id>/recharge"), ("POST", "/accounts/<user_id>/deduct")}

# who may call each route (api/authorization.py): operators create and change accounts, services charge them, users
# read their own
RULES = {
    ("POST", "/accounts"): only(ADMIN),
    ("GET", "/accounts/<user_id>"): only(SERVICE, ADMIN, owner=path_arg("user_id")),
    ("PATCH", "/accounts/<user_id>"): only(ADMIN),
    ("POST", "/accounts/<user_id>/recharge"): only(SERVICE),
    ("POST", "/accounts/<user_id>/deduct"): only(SERVICE),
    ("GET", "/accounts/<user_id>/orders/<order_id>"): only(SERVICE, ADMIN, owner=path_arg("user_id")),
}
