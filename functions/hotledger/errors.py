"""Domain errors: each carries the HTTP status and the machine-readable code the API answers with."""


class DomainError(Exception):
    status = 400
    code = "BAD_REQUEST"

    def __init__(self, message: str, **details: str):
        super().__init__(message)
        self.message, self.details = message, details


def _error(name: str, status: int, code: str) -> type[DomainError]:
    return type(name, (DomainError,), {"status": status, "code": code})


AccountNotFound = _error("AccountNotFound", 404, "ACCOUNT_NOT_FOUND")
OrderNotFound = _error("OrderNotFound", 404, "ORDER_NOT_FOUND")
DuplicateUserName = _error("DuplicateUserName", 409, "DUPLICATE_USER_NAME")
InsufficientBalance = _error("InsufficientBalance", 402, "INSUFFICIENT_BALANCE")
ApiClosed = _error("ApiClosed", 403, "API_CLOSED")
BalanceLimit = _error("BalanceLimit", 422, "BALANCE_LIMIT")
# an amount with more fractional digits than the account's currency has (JPY 0, USD 2, KWD 3)
InvalidAmount = _error("InvalidAmount", 422, "INVALID_AMOUNT")
# a recharge's credit grant that cannot be (expires_at not in the future)
InvalidGrant = _error("InvalidGrant", 422, "INVALID_GRANT")
IdempotencyKeyReused = _error("IdempotencyKeyReused", 409, "IDEMPOTENCY_KEY_REUSED")
IdempotencyInProgress = _error("IdempotencyInProgress", 409, "IDEMPOTENCY_IN_PROGRESS")
PendingOrders = _error("PendingOrders", 409, "PENDING_ORDERS")
PublishFailed = _error("PublishFailed", 503, "PUBLISH_FAILED")
ServiceUnavailable = _error("ServiceUnavailable", 503, "SERVICE_UNAVAILABLE")
# the lock's lease ran out and a newer owner wrote first (fencing token): nothing was changed
FencedOut = _error("FencedOut", 503, "LOCK_LOST")
# a charge that may or may not have been made (Redis or the DB did not answer, or the broker did not
# acknowledge and the rollback could not reach Redis); details carry the entry id to look up
ChargeOutcomeUnknown = _error("ChargeOutcomeUnknown", 503, "OUTCOME_UNKNOWN")

# flash sales
VoucherNotFound = _error("VoucherNotFound", 404, "VOUCHER_NOT_FOUND")
NotStarted = _error("NotStarted", 409, "SALE_NOT_STARTED")
Ended = _error("Ended", 409, "SALE_ENDED")
SoldOut = _error("SoldOut", 409, "SOLD_OUT")
AlreadyOrdered = _error("AlreadyOrdered", 409, "ALREADY_ORDERED")
# Redis lost a voucher or red packet and rebuilt it from the DB: sales wait until in-flight events landed
Recovering = _error("Recovering", 503, "RECOVERING")

# red packets
PacketNotFound = _error("PacketNotFound", 404, "PACKET_NOT_FOUND")
PacketNotOpen = _error("PacketNotOpen", 409, "PACKET_NOT_OPEN")
AlreadyGrabbed = _error("AlreadyGrabbed", 409, "ALREADY_GRABBED")
PacketEmpty = _error("PacketEmpty", 409, "EMPTY")
PacketExpired = _error("PacketExpired", 409, "EXPIRED")
TotalTooSmall = _error("TotalTooSmall", 422, "TOTAL_TOO_SMALL")

# holds: how a hold ended is its own code (a capture after a void is not a capture after an expiry)
HoldNotFound = _error("HoldNotFound", 404, "HOLD_NOT_FOUND")
HoldCaptured = _error("HoldCaptured", 409, "HOLD_CAPTURED")
HoldVoided = _error("HoldVoided", 409, "HOLD_VOIDED")
HoldExpired = _error("HoldExpired", 409, "HOLD_EXPIRED")
HoldNotDue = _error("HoldNotDue", 409, "HOLD_NOT_DUE")
CaptureExceedsHold = _error("CaptureExceedsHold", 409, "CAPTURE_EXCEEDS_HOLD")
# a capture of the hold is not durable yet: the hold cannot end meanwhile; nothing changed, retry (not the key's answer)
HoldBusy = _error("HoldBusy", 409, "HOLD_BUSY")

# refunds
RefundExceedsCharge = _error("RefundExceedsCharge", 409, "REFUND_EXCEEDS_CHARGE")
HoldNotEnded = _error("HoldNotEnded", 409, "HOLD_NOT_ENDED")
# the charge is not in the ledger's books yet (its event on its way to the DB, or its outcome unknown): nothing changed
ChargeNotBooked = _error("ChargeNotBooked", 409, "CHARGE_NOT_BOOKED")
# the service's own charges (a red packet's debit, a payment order's charge) are given back by their own lifecycle
NotRefundable = _error("NotRefundable", 409, "NOT_REFUNDABLE")

# transfers
TransferNotFound = _error("TransferNotFound", 404, "TRANSFER_NOT_FOUND")
SameAccount = _error("SameAccount", 422, "SAME_ACCOUNT")
CurrencyMismatch = _error("CurrencyMismatch", 422, "CURRENCY_MISMATCH")
AccountClosed = _error("AccountClosed", 409, "ACCOUNT_CLOSED")  # the payee, closed by an operator
TransferFailed = _error("TransferFailed", 409, "TRANSFER_FAILED")  # resumed under its key after its debit was refused

# webhooks
WebhookEndpointNotFound = _error("WebhookEndpointNotFound", 404, "WEBHOOK_ENDPOINT_NOT_FOUND")
InvalidWebhookUrl = _error("InvalidWebhookUrl", 422, "INVALID_WEBHOOK_URL")
WebhookEndpointLimit = _error("WebhookEndpointLimit", 409, "WEBHOOK_ENDPOINT_LIMIT")
# sealing secrets asked of a stack without WEBHOOK_SECRETS_KEY_ID (the local runtime): nothing can be sealed
NoSealingKey = _error("NoSealingKey", 409, "NO_SEALING_KEY")
InvalidWebhookTypes = _error("InvalidWebhookTypes", 422, "VALIDATION_ERROR")

# balance monitors
MonitorNotFound = _error("MonitorNotFound", 404, "MONITOR_NOT_FOUND")
InvalidMonitor = _error("InvalidMonitor", 422, "INVALID_MONITOR")

# history
InvalidFilter = _error("InvalidFilter", 422, "VALIDATION_ERROR")
InvalidCursor = _error("InvalidCursor", 422, "INVALID_CURSOR")
InvalidRange = _error("InvalidRange", 422, "INVALID_RANGE")
StatementTooLarge = _error("StatementTooLarge", 422, "STATEMENT_TOO_LARGE")
BeforeLedger = _error("BeforeLedger", 422, "BEFORE_LEDGER")

# payment orders, delay queues, journeys
PaymentOrderNotFound = _error("PaymentOrderNotFound", 404, "ORDER_NOT_FOUND")
PaymentOrderClosed = _error("PaymentOrderClosed", 409, "ORDER_CLOSED")
PaymentOrderPaid = _error("PaymentOrderPaid", 409, "ORDER_PAID")
ElementNotFound = _error("ElementNotFound", 404, "ELEMENT_NOT_FOUND")
JourneyNotFound = _error("JourneyNotFound", 404, "JOURNEY_NOT_FOUND")
QueueReserved = _error("QueueReserved", 409, "QUEUE_RESERVED")

# resource limits (Redis runs with noeviction): refused, nothing changed, retry once the backlog shrank
# (SQS refuses past its in-flight limit with OverLimit; Stripe answers 429 for what may succeed later)
QueueFull = _error("QueueFull", 429, "QUEUE_FULL")
TooManyPending = _error("TooManyPending", 429, "TOO_MANY_PENDING")
TooManyKeys = _error("TooManyKeys", 429, "TOO_MANY_KEYS")

# the operators' console
InvalidDeadLetterId = _error("InvalidDeadLetterId", 422, "INVALID_DEAD_LETTER_ID")
# older than what the rollback records (t_rolled_back, pruned after KEY_RETENTION_DAYS) can still judge: a replay could
# apply a change its client was told failed
DeadLetterExpired = _error("DeadLetterExpired", 409, "DEAD_LETTER_EXPIRED")

# authentication and authorization (api.authorization): nothing was changed
Unauthenticated = _error("Unauthenticated", 401, "UNAUTHENTICATED")
Forbidden = _error("Forbidden", 403, "FORBIDDEN")


def is_key_answer(exc: DomainError) -> bool:
    """Is this error an Idempotency-Key's answer for good? The one rule for every route (api/idempotency.py `once`,
    the ledger's own keys): a definitive answer is (a business refusal, a conflict, OUTCOME_UNKNOWN, which names what
    to look up); what changed nothing and may go otherwise on a retry is not: every 503 but OUTCOME_UNKNOWN, every
    429 (a backlog or a quota, Stripe's rule for 429s), a request still in flight under another key, a hold that
    cannot end until a capture of it is durable (HOLD_BUSY, milliseconds) and a refund waiting for its charge to be
    booked (CHARGE_NOT_BOOKED, seconds: its message says retry)."""
    if isinstance(exc, ChargeOutcomeUnknown):
        return True
    waits = (IdempotencyInProgress, HoldBusy, ChargeNotBooked)
    return exc.status < 500 and exc.status != 429 and not isinstance(exc, waits)
