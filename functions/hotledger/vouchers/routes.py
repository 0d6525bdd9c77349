"""Flash-sale routes: create and read vouchers, take and look up orders."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from aws_lambda_powertools.metrics import MetricUnit

from api.idempotency import KEY_CONFLICT, TOO_MANY_KEYS, Attempt, RouteKey, once
from api.responses import UNAVAILABLE, responses
from api.rules import ADMIN, SERVICE, HiddenOwner, Rule, body_field, only
from api.schemas import (
    CreateVoucherRequest,
    VoucherCreated,
    VoucherOrderRequest,
    VoucherOrderResult,
    VoucherOrderView,
    VoucherView,
)
from hotledger import errors, observability
from hotledger.vouchers.feature import vouchers
from hotledger.vouchers.service import VoucherOrder

router = Router()
logger = observability.logger()
metrics = observability.metrics()
VoucherId = Annotated[int, Path(gt=0, lt=2**63)]
_NOT_FOUND = (404, "VOUCHER_NOT_FOUND")


@router.post(
    "/vouchers",
    status_code=201,
    responses=responses(
        201,
        VoucherCreated,
        "voucher created and loaded into Redis",
        (422, "VALIDATION_ERROR: stock, times, limit or stock_shards invalid"),
    ),
)
def create_voucher(request: Annotated[CreateVoucherRequest, Body()]) -> dict[str, Any]:
    voucher_id = vouchers().create_voucher(
        request.title, request.stock, request.begin_at, request.end_at, request.per_user_limit, request.stock_shards
    )
    return {"voucher_id": str(voucher_id)}


@router.get("/vouchers/<voucher_id>", responses=responses(200, VoucherView, "the voucher", _NOT_FOUND))
def get_voucher(voucher_id: VoucherId) -> dict[str, Any]:
    v = vouchers().get_voucher(voucher_id)
    return VoucherView(
        voucher_id=str(v.voucher_id),
        title=v.title,
        initial_stock=v.initial_stock,
        stock_left=v.stock_left,
        sold=v.sold,
        pending=v.pending,
        per_user_limit=v.per_user_limit,
        begin_at=v.begin_at,
        end_at=v.end_at,
        stock_shards=len(v.bucket_stock_left),
        bucket_stock_left=list(v.bucket_stock_left),
    ).model_dump()


@router.post(
    "/vouchers/<voucher_id>/orders",
    responses=responses(
        200,
        VoucherOrderResult,
        "order taken; durable in the broker or the Redis Stream",
        _NOT_FOUND,
        UNAVAILABLE,
        (409, "SALE_NOT_STARTED, SALE_ENDED, SOLD_OUT or ALREADY_ORDERED; " + KEY_CONFLICT[1]),
        (404, "VOUCHER_NOT_FOUND or ACCOUNT_NOT_FOUND"),
        TOO_MANY_KEYS,
    ),
)
def order_voucher(
    voucher_id: VoucherId, request: Annotated[VoucherOrderRequest, Body()], idempotency_key: RouteKey = None
) -> Response[str]:
    # one order per user: (voucher, user) is the order's natural key, no DB write keeps the key's answer; more than
    # one: the key's reserved order id and answer are kept in the DB
    durable = idempotency_key is not None and vouchers().per_user_limit(voucher_id) > 1
    return once(
        f"account:{request.user_id}",
        idempotency_key,
        f"POST /vouchers/{voucher_id}/orders",
        request.model_dump(),
        lambda attempt: _order_voucher(voucher_id, request, attempt),
        resumable=True,
        durable=durable,
    )


def _order_voucher(voucher_id: int, request: VoucherOrderRequest, attempt: Attempt) -> dict[str, Any]:
    """The order id is the key's recovery point, kept before the unit is taken: an attempt resuming a dead one answers
    that order instead of taking a second unit."""
    resumed = None if attempt.resumed_from is None else int(attempt.resumed_from)
    try:
        order = vouchers().order(
            voucher_id, request.user_id, order_id=resumed, reserve=lambda order_id: attempt.remember(str(order_id))
        )
    except errors.AlreadyOrdered:
        # a keyed order of a one-per-user voucher whose buyer holds it: that order is the key's answer (Redis lost the
        # key's record, or the key is new)
        held = vouchers().order_in_slot(voucher_id, request.user_id, 1) if attempt.keyed else None
        if held is None or vouchers().per_user_limit(voucher_id) != 1:
            raise
        return _order_body(held)
    metrics.add_metric(name="VoucherOrders", unit=MetricUnit.Count, value=1)
    logger.info(
        "voucher ordered", extra={"voucher_id": voucher_id, "order_id": str(order.order_id), "user_id": order.user_id}
    )
    return _order_body(order)


def _order_body(order: VoucherOrder) -> dict[str, Any]:
    return VoucherOrderResult(
        order_id=str(order.order_id), voucher_id=str(order.voucher_id), user_id=order.user_id, seq=order.seq
    ).model_dump()


@router.get(
    "/vouchers/<voucher_id>/orders/<order_id>",
    responses=responses(200, VoucherOrderView, "the order", (404, "ORDER_NOT_FOUND")),
)
def get_voucher_order(voucher_id: VoucherId, order_id: Annotated[int, Path(gt=0, lt=2**63)]) -> dict[str, Any]:
    order = vouchers().get_order(voucher_id, order_id)
    return VoucherOrderView(
        order_id=str(order.order_id), voucher_id=str(voucher_id), user_id=order.user_id, status=order.status
    ).model_dump()


def _order_owner(args: dict[str, Any]) -> int:
    return vouchers().get_order(args["voucher_id"], args["order_id"]).user_id


_voucher_order_owner = HiddenOwner(
    _order_owner,
    lambda args: errors.OrderNotFound(f"order {args['order_id']} of voucher {args['voucher_id']} does not exist"),
)

RULES = {
    ("POST", "/vouchers"): only(ADMIN),
    ("GET", "/vouchers/<voucher_id>"): Rule(anyone=True),
    ("POST", "/vouchers/<voucher_id>/orders"): only(SERVICE, owner=body_field("user_id")),
    ("GET", "/vouchers/<voucher_id>/orders/<order_id>"): only(SERVICE, ADMIN, owner=_voucher_order_owner),
}
