"""HTTP request and response shapes (pydantic). Money is a decimal string at the edge: an Amount or Threshold field
checks its form once (hotledger.money.parse_amount) and holds the exact Decimal; the route turns it into the
account's minor units with the account's currency (hotledger.currencies: Currencies.minor), the one place that knows
how many fractional digits an account's amounts have. Events live in hotledger.outbox.events."""

from __future__ import annotations

import functools
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    model_validator,
)

from hotledger.money import MAX_DECIMALS, MINOR_UNITS, parse_amount

# What parse_amount accepts, stated in the document (a test checks they agree): at most 12 whole digits, no leading
# zero, at most 3 fractional digits (as many as the account's currency has: JPY 0, USD 2, KWD 3); an Amount is also
# not zero. ASCII digits only.
_DECIMAL = r"(0|[1-9][0-9]{0,11})(\.[0-9]{1,3})?"
_POSITIVE = r"([1-9][0-9]{0,11}(\.[0-9]{1,3})?|0\.([1-9][0-9]{0,2}|0[1-9][0-9]?|00[1-9]))"


def _minor_units_schema(example: str, *, allow_zero: bool) -> WithJsonSchema:
    """How a money field looks on the wire: a decimal string ("12.34"), never a JSON number."""
    pattern = f"^{_DECIMAL if allow_zero else _POSITIVE}$"
    description = (
        f"a decimal string in the account's currency, with at most as many fractional digits as the currency has (JPY"
        f" 0, USD 2, KWD 3; more is 422 INVALID_AMOUNT; never more than {MAX_DECIMALS}), "
        + ("0" if allow_zero else "above 0")
        + " to 999999999999.99; never a JSON number"
    )
    return WithJsonSchema(
        {"type": "string", "pattern": pattern, "maxLength": 16, "description": description, "examples": [example]}
    )


def _by_value(value: Decimal) -> int | str:
    """How a request's amount enters its Idempotency-Key fingerprint (model_dump): by value, "12.3" as "12.30"; as
    the cents it was before currencies (1234) when it has at most 2 fractional digits, so keys taken before stay
    bound to the same requests."""
    cents = value.scaleb(2)
    return int(cents) if cents == cents.to_integral_value() else format(value.normalize(), "f")


# A decimal string on the wire ("12.34"), an exact Decimal once validated (Currencies.minor: minor units).
Amount = Annotated[
    Decimal,
    PlainValidator(functools.partial(parse_amount, allow_zero=False)),
    PlainSerializer(_by_value),
    _minor_units_schema("12.34", allow_zero=False),
]
Threshold = Annotated[
    Decimal,
    PlainValidator(functools.partial(parse_amount, allow_zero=True)),
    PlainSerializer(_by_value),
    _minor_units_schema("0.00", allow_zero=True),
]


def _supported(code: str) -> str:
    if code not in MINOR_UNITS:
        raise ValueError(f"{code} is not a supported currency")
    return code


CurrencyCode = Annotated[
    StrictStr,
    Field(
        pattern=r"^[A-Z]{3}$",
        description="ISO 4217 code; its minor unit sets the digits of the account's amounts",
        json_schema_extra={"enum": sorted(MINOR_UNITS)},
    ),
    AfterValidator(_supported),
]


def _integral(value: object) -> object:
    """JSON Schema's "integer" includes 3.0: an integral float becomes the int it names (3.5, inf and NaN do not)."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


# Epoch milliseconds up to 9999-12-31T23:59:59.999Z: the DB keeps times as DATETIME(3)
MAX_EPOCH_MS = 253_402_300_799_999

# Integer fields (counts, limits, ids, times; never money): a JSON integer, 3.0 included; not a bool or a string. One
# alias per constraint set. The conversion comes last in Annotated so it wraps the constraints, and the document keeps
# minimum/maximum; a field's own description goes in a Field after it.
_EpochMs = Annotated[StrictInt, Field(ge=0, le=MAX_EPOCH_MS), BeforeValidator(_integral)]
_PositiveEpochMs = Annotated[StrictInt, Field(gt=0, le=MAX_EPOCH_MS), BeforeValidator(_integral)]
_Stock = Annotated[StrictInt, Field(gt=0, le=10_000_000), BeforeValidator(_integral)]
_UpTo1000 = Annotated[StrictInt, Field(gt=0, le=1000), BeforeValidator(_integral)]
_PacketCount = Annotated[StrictInt, Field(gt=0, le=10_000), BeforeValidator(_integral)]
_PacketTtlS = Annotated[StrictInt, Field(gt=0, le=7 * 24 * 3600), BeforeValidator(_integral)]
_DelayS = Annotated[StrictInt, Field(ge=0, le=365 * 86400), BeforeValidator(_integral)]
_CloseInS = Annotated[StrictInt, Field(gt=0, le=30 * 86400), BeforeValidator(_integral)]
# In a union (X | None) a Field after the conversion would describe the conversion, not the integer: the
# description goes with the constraints
_DueAtMs = Annotated[
    StrictInt, Field(ge=0, le=MAX_EPOCH_MS, description="epoch milliseconds"), BeforeValidator(_integral)
]
DeductType = Literal["ASYNC", "SYNC"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateAccountRequest(_Strict):
    user_name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")]
    deduct_type: DeductType = "ASYNC"
    # the text default is parsed like a sent value (pydantic types Field(default, validate_default=True) as Any)
    threshold: Threshold = Field("0", validate_default=True)
    currency: CurrencyCode | None = Field(None, description="ISO 4217, fixed for good; absent: DEFAULT_CURRENCY")


class PatchAccountRequest(_Strict):
    deduct_type: DeductType | None = None
    threshold: Threshold | None = None
    api_open: StrictBool | None = None


class AmountRequest(_Strict):
    amount: Amount


class GrantRequest(_Strict):
    expires_at: Annotated[_PositiveEpochMs, Field(description="epoch ms, in the future: what is left then expires")]
    category: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$", description="such as promo")]


class RechargeRequest(AmountRequest):
    grant: GrantRequest | None = Field(
        default=None, description="a credit grant: spent before the plain balance, first-to-expire; ends at expires_at"
    )


class GrantView(BaseModel):
    grant_id: str
    remaining: str
    expires_at: int = Field(description="epoch ms")
    category: str


class AccountCreated(BaseModel):
    user_id: int


class AccountView(BaseModel):
    user_id: int
    user_name: str
    currency: str = Field(description="ISO 4217: every amount of the account has its minor unit's digits")
    balance: str
    version: int
    threshold: str
    deduct_type: DeductType
    api_open: bool
    pending_orders: int = Field(description="charged in Redis, not yet in the DB")
    held_credits: str = Field(
        "0.00",
        description="credits in the balance whose events are not durable yet (normally for "
        "milliseconds): shown, not spendable until then",
    )
    held: str = Field("0.00", description="what the account's live holds keep (expired holds never count)")
    available: str = Field(
        description="balance - held_credits - held - what expired grants still hold: what deducts and new holds spend from"
    )
    grants: list[GrantView] = Field(default_factory=list, description="the live credit grants, first-to-expire")


class DeductResult(BaseModel):
    order_id: str = Field(description="63-bit id as a string (exact in JavaScript)")
    user_id: int
    amount: str
    balance: str
    version: int
    mode: DeductType


class RechargeResult(BaseModel):
    pay_id: str
    user_id: int
    amount: str
    balance: str
    version: int
    mode: DeductType


class OrderView(BaseModel):
    order_id: str
    user_id: int
    amount: str
    balance_after: str
    status: Literal["PENDING", "PERSISTED", "ROLLED_BACK"] = Field(
        description="PENDING: charged, not in the books yet (taken back if its publish fails); PERSISTED: booked; ROLLED_BACK: never charged (its "
        "publish failed and the DB recorded it rolled back)"
    )


# flash sale -------------------------------------------------------------------------------------------
UserRef = Annotated[StrictInt, Field(gt=0, lt=2**31), BeforeValidator(_integral)]


MAX_STOCK_SHARDS = 64
_StockShards = Annotated[StrictInt, Field(gt=0, le=MAX_STOCK_SHARDS), BeforeValidator(_integral)]


class CreateVoucherRequest(_Strict):
    """end_at must be after begin_at, stock_shards at most stock (422 VALIDATION_ERROR otherwise)."""

    title: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    stock: _Stock
    begin_at: Annotated[_EpochMs, Field(description="sale opens, epoch milliseconds")]
    end_at: Annotated[_PositiveEpochMs, Field(description="sale closes, epoch milliseconds (after begin_at)")]
    per_user_limit: _UpTo1000 = 1
    stock_shards: Annotated[
        _StockShards,
        Field(
            description="stock buckets, each its own Redis slot (shard): a hot "
            "sale spreads over them; 1 (the default) sells from one",
        ),
    ] = 1

    @model_validator(mode="after")
    def _ends_after_it_begins(self) -> CreateVoucherRequest:
        if self.end_at <= self.begin_at:
            raise ValueError("end_at must be after begin_at")
        if self.stock_shards > self.stock:
            raise ValueError("stock_shards must not exceed stock (every bucket starts with a unit)")
        return self


class VoucherCreated(BaseModel):
    voucher_id: str


class VoucherView(BaseModel):
    voucher_id: str
    title: str
    initial_stock: int
    stock_left: int = Field(description="in Redis: what can still be bought")
    sold: int = Field(description="orders persisted in the DB")
    pending: int = Field(description="orders taken in Redis, not yet in the DB")
    per_user_limit: int
    begin_at: int
    end_at: int
    stock_shards: int = Field(description="stock buckets it sells from")
    bucket_stock_left: list[int] = Field(description="stock_left per bucket")


class VoucherOrderRequest(_Strict):
    user_id: UserRef


class VoucherOrderResult(BaseModel):
    order_id: str
    voucher_id: str
    user_id: int
    seq: int = Field(description="the buyer's n-th order of this voucher")


class VoucherOrderView(BaseModel):
    order_id: str
    voucher_id: str
    user_id: int
    status: Literal["PENDING", "PERSISTED"]


# red packets -------------------------------------------------------------------------------------------
class CreateRedPacketRequest(_Strict):
    """total must be at least count x 0.01 (422 TOTAL_TOO_SMALL otherwise)."""

    sender_id: UserRef
    total: Amount
    count: _PacketCount
    expires_in_s: _PacketTtlS = 24 * 3600


class RedPacketCreated(BaseModel):
    packet_id: str
    sender_id: int
    total: str
    count: int
    expires_at: int


class GrabRequest(_Strict):
    user_id: UserRef


class GrabResult(BaseModel):
    packet_id: str
    item_id: str
    user_id: int
    amount: str
    credit: Literal["PENDING"] = Field(
        "PENDING",
        description=(
            "the claim is durable (in the log) and the item is this user's unless the DB refuses the claim, which only a "
            "Redis loss can cause; the grabber is credited under Idempotency-Key rp<item_id> once the DB accepted the "
            "claim (the writer, normally within a second; the reconciler after RECONCILE_AGE_S if that failed): a claim "
            "the DB refuses is never credited"
        ),
    )


class RedPacketGrab(BaseModel):
    user_id: int
    amount: str


class RedPacketView(BaseModel):
    packet_id: str
    sender_id: int
    state: str
    total: str
    count: int
    claimed: int
    remaining: int
    refund: str | None
    expires_at: int
    grabs: list[RedPacketGrab]


# delay queues ----------------------------------------------------------------------------------------------
QueueName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]
Element = Annotated[StrictStr, Field(min_length=1, max_length=512)]


class DelayOfferRequest(_Strict):
    """Give exactly one of delay_s and due_at (422 VALIDATION_ERROR otherwise)."""

    element: Element
    delay_s: _DelayS | None = None
    due_at: _DueAtMs | None = None

    @model_validator(mode="after")
    def _one_time(self) -> DelayOfferRequest:
        if (self.delay_s is None) == (self.due_at is None):
            raise ValueError("give exactly one of delay_s and due_at")
        return self


class DelayOfferResult(BaseModel):
    queue: str
    element: str
    due_at: int
    new: bool = Field(description="false: the element was queued already and its due time moved")


class DelayQueueView(BaseModel):
    queue: str
    size: int = Field(description="waiting")
    taken: int = Field(description="taken by a consumer, not acknowledged yet")
    earliest_due_at: int | None
    dead_letters: int = Field(0, description="elements moved to the dead letters after max_deliveries deliveries")


class DelayTakeRequest(_Strict):
    limit: _UpTo1000 = 100


class DelayTakenElement(BaseModel):
    element: str
    due_at: int
    receipt: str = Field(
        description="this delivery's receipt: acknowledge or extend by it (a later delivery of the "
        "same element has another one, and this one no longer counts)"
    )
    deliveries: int = Field(description="how many times the element was handed out, this time included")


class DelayTakeResult(BaseModel):
    elements: list[DelayTakenElement]
    visibility_timeout_ms: int = Field(description="acknowledge within this, or the elements are handed out again")


Receipt = Annotated[
    StrictStr,
    Field(
        min_length=3,
        max_length=560,
        pattern=r"^[0-9]{1,20}:.+$",
        description="a receipt from POST /delay-queues/{queue}/take",
    ),
]


class DelayAckRequest(_Strict):
    receipts: Annotated[list[Receipt], Field(min_length=1, max_length=1000)]


class DelayAckResult(DelayQueueView):
    acknowledged: int = Field(description="deliveries acknowledged by this request")
    stale_receipts: list[str] = Field(
        description="receipts that acknowledged nothing: a later delivery of the "
        "element holds it now, or it is no longer taken"
    )


class DelayExtendRequest(_Strict):
    receipts: Annotated[list[Receipt], Field(min_length=1, max_length=1000)]
    visibility_ms: Annotated[StrictInt, Field(gt=0, le=12 * 3600 * 1000, description="the new deadline is now + this")]


class DelayExtendResult(BaseModel):
    extended: int
    stale_receipts: list[str]


class DeadLetterView(BaseModel):
    element: str
    dead_at: int = Field(description="epoch ms")
    deliveries: int


class DeadLettersView(BaseModel):
    queue: str
    dead_letters: list[DeadLetterView]


class DeadLetterReplayRequest(_Strict):
    elements: Annotated[list[Element], Field(min_length=1, max_length=1000)]


class DeadLetterReplayResult(BaseModel):
    replayed: list[str] = Field(description="queued again, due now, delivery count reset")
    not_found: list[str]


# payment orders, inbox, journeys ---------------------------------------------------------------------------
class CreatePaymentOrderRequest(_Strict):
    user_id: UserRef
    amount: Amount
    close_in_s: _CloseInS


class PaymentOrderView(BaseModel):
    order_id: str
    user_id: int
    amount: str
    state: Literal["OPEN", "PAID", "CLOSED"]
    close_at: int
    reminder_due_at: int | None = Field(default=None, description="when the close reminder fires, while it is queued")


BizText = Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


class PostMessageRequest(_Strict):
    biz_type: BizText
    outer_biz_id: BizText
    title: Annotated[StrictStr, Field(min_length=1, max_length=200)]
    content: Annotated[StrictStr, Field(min_length=1, max_length=4000)]
    url: Annotated[StrictStr, Field(max_length=1000)] | None = None


class PostMessageResult(BaseModel):
    message_id: str
    duplicate: bool = Field(description="true: this (biz_type, outer_biz_id) was posted before; nothing was written")


class MessageView(BaseModel):
    message_id: str
    biz_type: str
    outer_biz_id: str
    title: str
    content: str
    url: str | None
    created_at: int


class MessagesView(BaseModel):
    messages: list[MessageView]


class JourneyView(BaseModel):
    biz: str
    account: int
    started_at: int | None


class ErrorBody(BaseModel):
    code: str = Field(examples=["INSUFFICIENT_BALANCE"])
    message: str
    entry_id: str | None = Field(default=None, description="OUTCOME_UNKNOWN only: the order or payment to look up")


class ErrorResponse(BaseModel):
    error: ErrorBody
