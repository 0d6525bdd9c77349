"""Delay-queue, payment-order, inbox and journey routes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from api.authorization import principal_of
from api.idempotency import KEY_CONFLICT, TOO_MANY_KEYS, Attempt, RouteKey, once
from api.responses import responses
from api.rules import ADMIN, SERVICE, HiddenOwner, only, path_arg
from api.schemas import (
    CreatePaymentOrderRequest,
    DeadLetterReplayRequest,
    DeadLetterReplayResult,
    DeadLettersView,
    DelayAckRequest,
    DelayAckResult,
    DelayExtendRequest,
    DelayExtendResult,
    DelayOfferRequest,
    DelayOfferResult,
    DelayQueueView,
    DelayTakeRequest,
    DelayTakeResult,
    JourneyView,
    MessagesView,
    PaymentOrderView,
    PostMessageRequest,
    PostMessageResult,
    QueueName,
)
from hotledger import errors
from hotledger.dal.delay_queue import QueueFull
from hotledger.notices.feature import inbox, journeys, payment_orders
from hotledger.notices.payment_orders import PaymentOrder
from hotledger.ops.feature import operations
from hotledger.runtime import currencies, delay_handlers, delay_queue

router = Router()
Queue = Annotated[QueueName, Path()]
Account = Annotated[int, Path(gt=0, lt=2**31)]
_RESERVED = (409, "QUEUE_RESERVED: the service's own queues are drained by the service")
_FULL = (429, "QUEUE_FULL: the queue holds its most elements (waiting + taken); nothing was changed")


def _open_queue(queue: str) -> str:
    if queue in delay_handlers():
        raise errors.QueueReserved(f"queue {queue!r} is drained by the service itself")
    return queue


@router.post(
    "/delay-queues/<queue>/items",
    responses=responses(200, DelayOfferResult, "queued (or its due time moved)", _RESERVED, _FULL),
)
def offer(queue: Queue, request: Annotated[DelayOfferRequest, Body()]) -> dict[str, Any]:
    due = _due_at(request)
    try:
        new = delay_queue().offer(_open_queue(queue), request.element, due_at_ms=due, bounded=True)
    except QueueFull as exc:
        raise errors.QueueFull(f"{exc}: take and acknowledge or remove elements first") from exc
    return DelayOfferResult(queue=queue, element=request.element, due_at=due, new=new).model_dump()


def _due_at(request: DelayOfferRequest) -> int:
    """due_at, or delay_s from now: the request holds exactly one of them (DelayOfferRequest's validator)."""
    due_at: int | None = request.due_at
    delay_s: int | None = request.delay_s
    if due_at is not None:
        return due_at
    if delay_s is None:  # never: refused by the validator
        raise ValueError("give exactly one of delay_s and due_at")
    return int(time.time() * 1000) + delay_s * 1000


@router.delete(
    "/delay-queues/<queue>/items/<element>",
    responses=responses(200, DelayOfferResult, "removed", (404, "ELEMENT_NOT_FOUND"), _RESERVED),
)
def remove(queue: Queue, element: Annotated[str, Path(min_length=1, max_length=512)]) -> dict[str, Any]:
    due = delay_queue().due_at(_open_queue(queue), element)
    if not delay_queue().remove(queue, element):
        raise errors.ElementNotFound(f"{element!r} is not in queue {queue!r}")
    return DelayOfferResult(queue=queue, element=element, due_at=due or 0, new=False).model_dump()


@router.get("/delay-queues/<queue>", responses=responses(200, DelayQueueView, "size and earliest due time"))
def queue_view(queue: Queue) -> dict[str, Any]:
    return _view(queue).model_dump()


def _view(queue: str) -> DelayQueueView:
    stats = delay_queue().stats(queue)
    return DelayQueueView(
        queue=queue,
        size=stats.waiting,
        taken=stats.taken,
        earliest_due_at=delay_queue().earliest(queue),
        dead_letters=stats.dead,
    )


@router.post(
    "/delay-queues/<queue>/take", responses=responses(200, DelayTakeResult, "due elements, now taken", _RESERVED)
)
def take(queue: Queue, request: Annotated[DelayTakeRequest, Body()]) -> dict[str, Any]:
    taken = delay_queue().drain(_open_queue(queue), int(time.time() * 1000), request.limit)
    return {
        "elements": [
            {"element": d.element, "due_at": d.due, "receipt": d.receipt, "deliveries": d.deliveries}
            for d in taken.deliveries
        ],
        "visibility_timeout_ms": delay_queue().visibility_ms,
    }


@router.post(
    "/delay-queues/<queue>/ack",
    responses=responses(
        200, DelayAckResult, "acknowledged by receipt (handled for good); stale receipts change nothing", _RESERVED
    ),
)
def ack(queue: Queue, request: Annotated[DelayAckRequest, Body()]) -> dict[str, Any]:
    done = delay_queue().ack(_open_queue(queue), request.receipts)
    stale = [receipt for receipt, ok in zip(request.receipts, done, strict=True) if not ok]
    return DelayAckResult(**_view(queue).model_dump(), acknowledged=sum(done), stale_receipts=stale).model_dump()


@router.post(
    "/delay-queues/<queue>/extend",
    responses=responses(200, DelayExtendResult, "visibility deadlines moved, by receipt", _RESERVED),
)
def extend(queue: Queue, request: Annotated[DelayExtendRequest, Body()]) -> dict[str, Any]:
    done = delay_queue().extend(_open_queue(queue), request.receipts, request.visibility_ms)
    return DelayExtendResult(
        extended=sum(done), stale_receipts=[r for r, ok in zip(request.receipts, done, strict=True) if not ok]
    ).model_dump()


# dead letters: allowed on the service's own queues too (an operator replays a reminder the service gave up on)
@router.get("/delay-queues/<queue>/dead-letters", responses=responses(200, DeadLettersView, "the oldest first"))
def dead_letters(queue: Queue, limit: Annotated[int, Query(gt=0, le=1000)] = 100) -> dict[str, Any]:
    dead = delay_queue().dead_letters(queue, limit)
    return DeadLettersView(
        queue=queue,
        dead_letters=[{"element": d.element, "dead_at": d.dead_at, "deliveries": d.deliveries} for d in dead],
    ).model_dump()


@router.post(
    "/delay-queues/<queue>/dead-letters/replay",
    responses=responses(200, DeadLetterReplayResult, "queued again, due now"),
)
def replay_dead_letters(queue: Queue, request: Annotated[DeadLetterReplayRequest, Body()]) -> dict[str, Any]:
    done = delay_queue().replay_dead(queue, request.elements)
    result = DeadLetterReplayResult(
        replayed=[e for e, ok in zip(request.elements, done, strict=True) if ok],
        not_found=[e for e, ok in zip(request.elements, done, strict=True) if not ok],
    ).model_dump()
    operations().record(principal_of(router.current_event), "replay.delay", {"queue": queue, **result})
    return result


@router.delete(
    "/delay-queues/<queue>/dead-letters/<element>",
    responses=responses(
        200, DeadLettersView, "dropped; the dead letters left (the oldest first)", (404, "ELEMENT_NOT_FOUND")
    ),
)
def drop_dead_letter(queue: Queue, element: Annotated[str, Path(min_length=1, max_length=512)]) -> dict[str, Any]:
    if not delay_queue().drop_dead(queue, [element])[0]:
        raise errors.ElementNotFound(f"{element!r} is not a dead letter of queue {queue!r}")
    return dead_letters(queue)


def _payment_order_body(payment_order: PaymentOrder) -> dict[str, Any]:
    format_minor = currencies().of(payment_order.user_id).format
    return PaymentOrderView(
        order_id=str(payment_order.id),
        user_id=payment_order.user_id,
        amount=format_minor(payment_order.amount),
        state=payment_order.state.value,
        close_at=payment_order.close_at,
        reminder_due_at=payment_order.reminder_due_at,
    ).model_dump()


_PAYMENT_ORDER_NOT_FOUND = (404, "ORDER_NOT_FOUND")
PaymentOrderId = Annotated[int, Path(gt=0, lt=2**63)]


@router.post(
    "/orders",
    status_code=201,
    responses=responses(
        201, PaymentOrderView, "order created, reminder queued", (404, "ACCOUNT_NOT_FOUND"), KEY_CONFLICT, TOO_MANY_KEYS
    ),
)
def create_order(
    request: Annotated[CreatePaymentOrderRequest, Body()], idempotency_key: RouteKey = None
) -> Response[str]:
    return once(
        f"account:{request.user_id}",
        idempotency_key,
        "POST /orders",
        request.model_dump(),
        lambda attempt: _create_order(request, attempt),
        status=201,
        resumable=True,
        durable=True,
    )


def _create_order(request: CreatePaymentOrderRequest, attempt: Attempt) -> dict[str, Any]:
    """The order's id is the key's recovery point, kept (in the DB too) before the order is inserted: an attempt
    resuming a dead one answers that order instead of creating a second."""
    resumed = None if attempt.resumed_from is None else int(attempt.resumed_from)
    return _payment_order_body(
        payment_orders().create(
            request.user_id,
            currencies().minor(request.user_id, request.amount),
            request.close_in_s,
            reserve=lambda order_id: attempt.remember(str(order_id)),
            payment_order_id=resumed,
        )
    )


@router.get("/orders/<order_id>", responses=responses(200, PaymentOrderView, "the order", _PAYMENT_ORDER_NOT_FOUND))
def get_order(order_id: PaymentOrderId) -> dict[str, Any]:
    return _payment_order_body(payment_orders().get(order_id))


@router.post(
    "/orders/<order_id>/pay",
    responses=responses(
        200,
        PaymentOrderView,
        "paid (a deduct from the user's account); the reminder is removed",
        _PAYMENT_ORDER_NOT_FOUND,
        (402, "INSUFFICIENT_BALANCE"),
        (409, "ORDER_CLOSED; " + KEY_CONFLICT[1]),
        TOO_MANY_KEYS,
    ),
)
def pay_order(order_id: PaymentOrderId, idempotency_key: RouteKey = None) -> Response[str]:
    return _order_step(order_id, idempotency_key, "pay", lambda: payment_orders().pay(order_id))


@router.post(
    "/orders/<order_id>/close",
    responses=responses(
        200,
        PaymentOrderView,
        "closed; the reminder is removed",
        _PAYMENT_ORDER_NOT_FOUND,
        (409, "ORDER_PAID; " + KEY_CONFLICT[1]),
        TOO_MANY_KEYS,
    ),
)
def close_order(order_id: PaymentOrderId, idempotency_key: RouteKey = None) -> Response[str]:
    return _order_step(order_id, idempotency_key, "close", lambda: payment_orders().close(order_id))


def _order_step(
    order_id: int, idempotency_key: str | None, step: str, run: Callable[[], PaymentOrder]
) -> Response[str]:
    """POST /orders/<id>/<step> (pay, close): once per Idempotency-Key in the order's scope (a key used for one
    step conflicts with the other), the answer kept in the DB too."""
    return once(
        f"order:{order_id}",
        idempotency_key,
        f"POST /orders/{order_id}/{step}",
        None,
        lambda: _payment_order_body(run()),
        durable=True,
    )


@router.post(
    "/inbox/<account>/messages",
    responses=responses(200, PostMessageResult, "written, or the first message's id", (404, "ACCOUNT_NOT_FOUND")),
)
def post_message(account: Account, request: Annotated[PostMessageRequest, Body()]) -> dict[str, Any]:
    message_id, new = inbox().post(
        account, request.biz_type, request.outer_biz_id, request.title, request.content, request.url
    )
    return {"message_id": message_id, "duplicate": not new}


@router.get("/inbox/<account>/messages", responses=responses(200, MessagesView, "messages after `after`, oldest first"))
def pull_messages(
    account: Account,
    after: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(gt=0, le=200)] = 50,
) -> dict[str, Any]:
    return {"messages": [m.__dict__ for m in inbox().pull(account, after, limit)]}


@router.post(
    "/journeys/<biz>/<account>/start",
    responses=responses(
        200, JourneyView, "started (a repeat keeps the first start)", (404, "JOURNEY_NOT_FOUND or ACCOUNT_NOT_FOUND")
    ),
)
def start_journey(biz: Annotated[str, Path(max_length=64)], account: Account) -> dict[str, Any]:
    return {"biz": biz, "account": account, "started_at": journeys().start(biz, account, int(time.time() * 1000))}


@router.post(
    "/journeys/<biz>/<account>/finish",
    responses=responses(200, JourneyView, "finished: no reminder", (404, "JOURNEY_NOT_FOUND")),
)
def finish_journey(biz: Annotated[str, Path(max_length=64)], account: Account) -> dict[str, Any]:
    journeys().finish(biz, account)
    return {"biz": biz, "account": account, "started_at": None}


def _order_owner(args: dict[str, Any]) -> int:
    return payment_orders().get(args["order_id"]).user_id


_payment_order_owner = HiddenOwner(
    _order_owner, lambda args: errors.PaymentOrderNotFound(f"order {args['order_id']} does not exist")
)

RULES = {
    # payment orders: the merchant's backend creates and closes them, the user pays their own
    ("POST", "/orders"): only(SERVICE),
    ("GET", "/orders/<order_id>"): only(SERVICE, ADMIN, owner=_payment_order_owner),
    ("POST", "/orders/<order_id>/pay"): only(SERVICE, owner=_payment_order_owner),
    ("POST", "/orders/<order_id>/close"): only(SERVICE),
    # delay queues are the backend's; their dead letters are the operators'
    ("POST", "/delay-queues/<queue>/items"): only(SERVICE),
    ("DELETE", "/delay-queues/<queue>/items/<element>"): only(SERVICE),
    ("GET", "/delay-queues/<queue>"): only(SERVICE, ADMIN),
    ("POST", "/delay-queues/<queue>/take"): only(SERVICE),
    ("POST", "/delay-queues/<queue>/ack"): only(SERVICE),
    ("POST", "/delay-queues/<queue>/extend"): only(SERVICE),
    ("GET", "/delay-queues/<queue>/dead-letters"): only(ADMIN),
    ("POST", "/delay-queues/<queue>/dead-letters/replay"): only(ADMIN),
    ("DELETE", "/delay-queues/<queue>/dead-letters/<element>"): only(ADMIN),
    # the inbox: the platform posts, the user reads their own; journeys are the platform's
    ("POST", "/inbox/<account>/messages"): only(SERVICE),
    ("GET", "/inbox/<account>/messages"): only(SERVICE, owner=path_arg("account")),
    ("POST", "/journeys/<biz>/<account>/start"): only(SERVICE),
    ("POST", "/journeys/<biz>/<account>/finish"): only(SERVICE),
}
