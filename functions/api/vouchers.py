"""Flash-sale routes: create and read vouchers, take and look up orders."""
from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from aws_lambda_powertools.metrics import MetricUnit

from api.idempotency import KEY_CONFLICT, RouteKey, once
from api.responses import UNAVAILABLE, responses
from hotledger import observability
from api.schemas import (
    CreateVoucherRequest, VoucherCreated, VoucherOrderRequest, VoucherOrderResult, VoucherOrderView, VoucherView,
)
from hotledger.runtime import vouchers

router = Router()
logger = observability.logger()
metrics = observability.metrics()
VoucherId = Annotated[int, Path(gt=0, lt=2**63)]
_NOT_FOUND = (404, "VOUCHER_NOT_FOUND")


@router.post("/vouchers", status_code=201, responses=responses(201, VoucherCreated, "voucher created and loaded into Redis",
                                                                 (422, "VALIDATION_ERROR: stock, times or limit invalid")))
def create_voucher(request: Annotated[CreateVoucherRequest, Body()]) -> dict:
    voucher_id = vouchers().create_voucher(request.title, request.stock, request.begin_at, request.end_at, request.per_user_limit)
    return {"voucher_id": str(voucher_id)}


@router.get("/vouchers/<voucher_id>", responses=responses(200, VoucherView, "the voucher", _NOT_FOUND))
def get_voucher(voucher_id: VoucherId) -> dict:
    v = vouchers().get_voucher(voucher_id)
    return VoucherView(voucher_id=str(v.voucher_id), title=v.title, initial_stock=v.initial_stock, stock_left=v.stock_left,
                       sold=v.sold, pending=v.pending, per_user_limit=v.per_user_limit, begin_at=v.begin_at,
                       end_at=v.end_at).model_dump()


@router.post("/vouchers/<voucher_id>/orders", responses=responses(
    200, VoucherOrderResult, "order taken; durable in the broker or the Redis Stream", _NOT_FOUND, UNAVAILABLE,
    (409, "SALE_NOT_STARTED, SALE_ENDED, SOLD_OUT or ALREADY_ORDERED; " + KEY_CONFLICT[1]),
    (404, "VOUCHER_NOT_FOUND or ACCOUNT_NOT_FOUND")))
def order_voucher(voucher_id: VoucherId, request: Annotated[VoucherOrderRequest, Body()], idempotency_key: RouteKey = None):
    return once(f"account:{request.user_id}", idempotency_key, f"POST /vouchers/{voucher_id}/orders", request.model_dump(),
                lambda: _order_voucher(voucher_id, request))


def _order_voucher(voucher_id: int, request: VoucherOrderRequest) -> dict:
    order = vouchers().order(voucher_id, request.user_id)
    metrics.add_metric(name="VoucherOrders", unit=MetricUnit.Count, value=1)
    logger.info("voucher ordered", extra={"voucher_id": voucher_id, "order_id": str(order.order_id), "user_id": order.user_id})
    return VoucherOrderResult(order_id=str(order.order_id), voucher_id=str(voucher_id), user_id=order.user_id,
                              seq=order.seq).model_dump()


@router.get("/vouchers/<voucher_id>/orders/<order_id>", responses=responses(
    200, VoucherOrderView, "the order", (404, "ORDER_NOT_FOUND")))
def get_voucher_order(voucher_id: VoucherId, order_id: Annotated[int, Path(gt=0, lt=2**63)]) -> dict:
    order = vouchers().get_order(voucher_id, order_id)
    return VoucherOrderView(order_id=str(order.order_id), voucher_id=str(voucher_id), user_id=order.user_id,
                            status=order.status).model_dump()
