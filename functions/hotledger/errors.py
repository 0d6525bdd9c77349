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
IdempotencyKeyReused = _error("IdempotencyKeyReused", 409, "IDEMPOTENCY_KEY_REUSED")
IdempotencyInProgress = _error("IdempotencyInProgress", 409, "IDEMPOTENCY_IN_PROGRESS")
PendingOrders = _error("PendingOrders", 409, "PENDING_ORDERS")
PublishFailed = _error("PublishFailed", 503, "PUBLISH_FAILED")
ServiceUnavailable = _error("ServiceUnavailable", 503, "SERVICE_UNAVAILABLE")
# a charge that may or may not have been made (Redis or the DB did not answer, or the broker did not
# acknowledge and the rollback could not reach Redis); details carry the entry id to look up
ChargeOutcomeUnknown = _error("ChargeOutcomeUnknown", 503, "OUTCOME_UNKNOWN")
