"""Request, response and event shapes (pydantic). Money is a decimal string at the edge."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from hotledger.money import parse_minor

MONEY_PATTERN = r"^(0|[1-9][0-9]{0,14})(\.[0-9]{1,2})?$"


def _positive_amount(text: str) -> str:
    parse_minor(text)
    return text


def _non_negative_amount(text: str) -> str:
    parse_minor(text, allow_zero=True)
    return text


Amount = Annotated[StrictStr, AfterValidator(_positive_amount), Field(examples=["12.34"], pattern=MONEY_PATTERN)]
Threshold = Annotated[StrictStr, AfterValidator(_non_negative_amount), Field(examples=["0.00"], pattern=MONEY_PATTERN)]
DeductType = Literal["ASYNC", "SYNC"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateAccountRequest(_Strict):
    user_name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")]
    deduct_type: DeductType = "ASYNC"
    threshold: Threshold = "0.00"


class PatchAccountRequest(_Strict):
    deduct_type: DeductType | None = None
    threshold: Threshold | None = None
    api_open: StrictBool | None = None


class AmountRequest(_Strict):
    amount: Amount


class AccountCreated(BaseModel):
    user_id: int


class AccountView(BaseModel):
    user_id: int
    user_name: str
    balance: str
    version: int
    threshold: str
    deduct_type: DeductType
    api_open: bool
    pending_orders: int = Field(description="charged in Redis, not yet in the DB")


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
    status: Literal["PENDING", "PERSISTED"]


class ErrorBody(BaseModel):
    code: str = Field(examples=["INSUFFICIENT_BALANCE"])
    message: str
    entry_id: str | None = Field(default=None, description="OUTCOME_UNKNOWN only: the order or payment to look up")


class ErrorResponse(BaseModel):
    error: ErrorBody


class LedgerEvent(BaseModel):
    """One Redis-side change travelling to the DB (the Kafka record value)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["ledger"]
    id: Annotated[StrictInt, Field(gt=0)]
    kind: Literal["D", "R"]
    user_id: Annotated[StrictInt, Field(gt=0)]
    amount: Annotated[StrictInt, Field(gt=0)]
    balance_after: StrictInt
    version: StrictInt
    epoch: str
    ts: StrictInt
    open: str
    idem_key: str | None = None

    @property
    def delta(self) -> int:
        return -self.amount if self.kind == "D" else self.amount
