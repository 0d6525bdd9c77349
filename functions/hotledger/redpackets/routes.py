"""Red packet routes: send, grab, read."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from aws_lambda_powertools.metrics import MetricUnit

from api.idempotency import KEY_CONFLICT, TOO_MANY_KEYS, Attempt, RouteKey, once
from api.responses import UNAVAILABLE, responses
from api.rules import SERVICE, Rule, body_field, only
from api.schemas import CreateRedPacketRequest, GrabRequest, GrabResult, RedPacketCreated, RedPacketGrab, RedPacketView
from hotledger import errors, observability
from hotledger.redpackets.feature import redpackets
from hotledger.runtime import currencies

router = Router()
logger = observability.logger()
metrics = observability.metrics()
PacketId = Annotated[int, Path(gt=0, lt=2**63)]
_NOT_FOUND = (404, "PACKET_NOT_FOUND or ACCOUNT_NOT_FOUND")


@router.post(
    "/redpackets",
    status_code=201,
    responses=responses(
        201,
        RedPacketCreated,
        "the sender was debited the total; the packet is open",
        UNAVAILABLE,
        (402, "INSUFFICIENT_BALANCE"),
        (403, "API_CLOSED"),
        (404, "ACCOUNT_NOT_FOUND"),
        (422, "TOTAL_TOO_SMALL: below count x 0.01, or invalid input"),
        KEY_CONFLICT,
        TOO_MANY_KEYS,
    ),
)
def create_packet(
    request: Annotated[CreateRedPacketRequest, Body()], idempotency_key: RouteKey = None
) -> Response[str]:
    return once(
        f"account:{request.sender_id}",
        idempotency_key,
        "POST /redpackets",
        request.model_dump(),
        lambda attempt: _create_packet(request, attempt),
        status=201,
        resumable=True,
        durable=True,
    )


def _create_packet(request: CreateRedPacketRequest, attempt: Attempt) -> dict[str, Any]:
    """The packet's id is the key's recovery point, kept before the sender is debited: an attempt resuming a dead
    one finishes that packet (debited at most once under rp<id>) instead of sending a second."""
    total = currencies().minor(request.sender_id, request.total, "total")
    args = (request.sender_id, total, request.count, request.expires_in_s)
    if attempt.resumed_from is not None:
        packet = redpackets().resume(int(attempt.resumed_from), *args)
    else:
        packet = redpackets().create(*args, reserve=lambda packet_id: attempt.remember(str(packet_id)))
    metrics.add_metric(name="RedPacketsSent", unit=MetricUnit.Count, value=1)
    logger.info(
        "red packet sent",
        extra={
            "packet_id": str(packet.packet_id),
            "sender_id": packet.sender_id,
            "total_minor": packet.total,
            "count": packet.count,
        },
    )
    format_minor = currencies().of(packet.sender_id).format
    return RedPacketCreated(
        packet_id=str(packet.packet_id),
        sender_id=packet.sender_id,
        total=format_minor(packet.total),
        count=packet.count,
        expires_at=packet.expires_at,
    ).model_dump()


@router.post(
    "/redpackets/<packet_id>/grab",
    responses=responses(
        200,
        GrabResult,
        "claimed; the credit follows once the claim is durable in the DB (credit: PENDING)",
        _NOT_FOUND,
        UNAVAILABLE,
        (409, "ALREADY_GRABBED, EMPTY, EXPIRED or PACKET_NOT_OPEN; " + KEY_CONFLICT[1]),
        (422, "CURRENCY_MISMATCH: the grabber's account holds another currency than the sender's"),
        TOO_MANY_KEYS,
    ),
)
def grab_packet(
    packet_id: PacketId, request: Annotated[GrabRequest, Body()], idempotency_key: RouteKey = None
) -> Response[str]:
    return once(
        f"account:{request.user_id}",
        idempotency_key,
        f"POST /redpackets/{packet_id}/grab",
        request.model_dump(),
        lambda attempt: _grab_packet(packet_id, request, attempt),
        resumable=True,
    )


def _grab_packet(packet_id: int, request: GrabRequest, attempt: Attempt) -> dict[str, Any]:
    currency = currencies().of(request.user_id)
    sender = redpackets().sender_of(packet_id)
    if sender is not None and currencies().of(sender) != currency:  # the grabber would be credited in another one
        raise errors.CurrencyMismatch(
            f"red packet {packet_id} pays in {currencies().of(sender).code}; account {request.user_id} holds "
            f"{currency.code}"
        )
    format_minor = currency.format
    try:
        grab = redpackets().grab(packet_id, request.user_id)
    except errors.AlreadyGrabbed as exc:
        if not attempt.keyed:
            raise
        # (packet, user) is the grab's natural key: a keyed grab by a user holding an item of the packet answers that
        # item (an attempt that died under this key took it, or Redis lost the key's record); no DB write per grab
        # keeps this answer, and the credit is the writer's, once the DB accepted the claim (rp<item id>)
        amount = dict(redpackets().get(packet_id).grabs).get(request.user_id)
        if amount is None:
            raise
        return GrabResult(
            packet_id=str(packet_id),
            item_id=exc.details["item_id"],
            user_id=request.user_id,
            amount=format_minor(amount),
        ).model_dump()
    metrics.add_metric(name="RedPacketGrabs", unit=MetricUnit.Count, value=1)
    logger.info(
        "red packet grabbed",
        extra={
            "packet_id": str(packet_id),
            "item_id": str(grab.item_id),
            "user_id": grab.user_id,
            "amount_minor": grab.amount,
        },
    )
    return GrabResult(
        packet_id=str(packet_id), item_id=str(grab.item_id), user_id=grab.user_id, amount=format_minor(grab.amount)
    ).model_dump()


@router.get("/redpackets/<packet_id>", responses=responses(200, RedPacketView, "the packet", _NOT_FOUND))
def get_packet(packet_id: PacketId) -> dict[str, Any]:
    p = redpackets().get(packet_id)
    format_minor = currencies().of(p.sender_id).format
    return RedPacketView(
        packet_id=str(p.packet_id),
        sender_id=p.sender_id,
        state=p.state,
        total=format_minor(p.total),
        count=p.count,
        claimed=len(p.grabs),
        remaining=p.count - len(p.grabs),
        expires_at=p.expires_at,
        refund=None if p.refund is None else format_minor(p.refund),
        grabs=[RedPacketGrab(user_id=user, amount=format_minor(amount)) for user, amount in p.grabs],
    ).model_dump()


# a service sends for a sender (the sender's money moves), users grab as themselves
RULES = {
    ("POST", "/redpackets"): only(SERVICE),
    ("POST", "/redpackets/<packet_id>/grab"): only(SERVICE, owner=body_field("user_id")),
    ("GET", "/redpackets/<packet_id>"): Rule(anyone=True),
}
