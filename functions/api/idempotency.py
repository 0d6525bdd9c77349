"""The Idempotency-Key header and its answer replay for the routes that move money or stock.

Deducts and recharges pass the key to the ledger, which keeps its answers in Redis and the DB for good. The other
money- or stock-moving POSTs (red packets, grabs, voucher orders, payment orders, pay, close) run through `once`,
Stripe's model over hotledger.dal.idempotency: keys are scoped per account (per payment order for pay and close),
bound to the route and the validated body, and their first answer (status and body, a business refusal or OUTCOME_UNKNOWN included) is
replayed for 24 h from Redis; the effect underneath happens once. Durable routes (red packets, payment orders, pay,
close, voucher orders of a voucher allowing more than one per user) also keep the recovery point and the answer in the
DB for good, so a retry after Redis lost the record answers the same; grabs and one-per-user voucher orders rebuild
their answer from their natural key instead (one grab per packet and user, one order per voucher and user), which costs
no DB write on their hot path. What changed nothing and may go otherwise on a retry is no answer (errors.is_key_answer,
one rule for every route): a 503 (SERVICE_UNAVAILABLE, PUBLISH_FAILED, RECOVERING, LOCK_LOST), a 429 (TOO_MANY_PENDING
from the ledger underneath, a quota), a request still in flight (IDEMPOTENCY_IN_PROGRESS): the key may try again.
OUTCOME_UNKNOWN is the key's answer (Stripe
replays its 500s): it names what to look up (the packet, the entry), and running the request again under the key
could move money or stock a second time (a second packet and debit, a second unit of a voucher). A backing service's
lost answer (responses.ANSWER_LOST, answered OUTCOME_UNKNOWN without an id) is no answer either way: the key stays in
flight until its lease ends, as after a kill, and a retry then takes it over from the recovery point it left."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Header

from api.authorization import key_scope
from api.responses import ANSWER_LOST, error, json_answer
from hotledger import errors, observability
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.idempotency import BeginStatus
from hotledger.dal.lock import LockUnavailable
from hotledger.dal.redis_store import RedisUnavailable
from hotledger.runtime import idempotency

logger = observability.logger()

_PATTERN = r"^[A-Za-z0-9_.:-]+$"
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=100,
        pattern=_PATTERN,
        description="Retry-safe key, scoped to the account in the path; the ledger's charges of an account (deducts, "
        "recharges, an operator's balance changes) share one set of keys, apart from its other routes' (transfers, "
        "holds, refunds, ...). The first "
        "definitive answer, a charge or a refusal (402 INSUFFICIENT_BALANCE, 403 API_CLOSED, 422 BALANCE_LIMIT), "
        "is replayed for the same key and body for the key's whole life; another body or kind gets 409 "
        "IDEMPOTENCY_KEY_REUSED; 503 answers are not recorded: retry with the same key. Keys are kept in Redis "
        "for 24 h and in the DB for KEY_RETENTION_DAYS (then a key is a new key). An account opens at most "
        "MAX_IDEMPOTENCY_KEYS new keys per 24 h: past that a new key gets 429 TOO_MANY_KEYS (not the key's "
        "answer).",
    ),
]
RouteKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=100,
        pattern=_PATTERN,
        description="Retry-safe key, scoped to the acting account (for POST /transfers the payer, from; to the "
        "payment order for pay and close), apart from the keys of the ledger's charges of that account (deducts, "
        "recharges, an operator's balance changes). The first answer, success or refusal, is replayed for the same key, route and body and the "
        "money or stock moves once: for good for red packets, payment orders, pay, close, transfers and voucher "
        "orders of a voucher allowing more than one per user (kept in Redis 24 h and in the DB for "
        "KEY_RETENTION_DAYS); for grabs and one-per-user voucher orders, 24 h from Redis and then (or after a Redis loss) the "
        "user's grab or order itself answers any keyed retry. Another route or body gets 409 "
        "IDEMPOTENCY_KEY_REUSED, a retry while the first request is in flight 409 "
        "IDEMPOTENCY_IN_PROGRESS; 503 answers are not recorded (retry with the same key) except "
        "OUTCOME_UNKNOWN: one naming what to look up is replayed; one without an id (a backing service's answer was "
        "lost) holds the key, IDEMPOTENCY_IN_PROGRESS, until the first attempt's lease ends. A scope opens at most "
        "MAX_IDEMPOTENCY_KEYS new keys per 24 h: past that a new key gets 429 TOO_MANY_KEYS.",
    ),
]
KEY_CONFLICT = (409, "IDEMPOTENCY_KEY_REUSED: same Idempotency-Key with another route or body; IDEMPOTENCY_IN_PROGRESS")
TOO_MANY_KEYS = (429, "TOO_MANY_KEYS: the caller opened its most Idempotency-Keys for now; nothing was changed")


def fingerprint(route: str, body: dict[str, Any] | None) -> str:
    return hashlib.sha256(json.dumps([route, body], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Attempt:
    """What a resumable request sees (once(..., resumable=True)): whether it took the key over from an attempt that
    died under it or whose Redis record was lost (`retaken`), the recovery point that attempt left (`resumed_from`, None
    when there was none), `remember` to leave its own before any effect (it raises IDEMPOTENCY_IN_PROGRESS when the
    key is no longer this request's: nothing may follow), and whether the request carries a key at all (`keyed`)."""

    resumed_from: str | None
    remember: Callable[[str], object]
    retaken: bool = False
    keyed: bool = False


def once(
    scope: str,
    idem_key: str | None,
    route: str,
    body: dict[str, Any] | None,
    run: Callable[..., dict[str, Any]],
    status: int = 200,
    resumable: bool = False,
    durable: bool = False,
) -> Response[str]:
    """Answer `run()` (its dict as JSON with `status`), once per (scope, key): a retry replays the first answer.
    With `resumable`, run(attempt) is given an Attempt (Stripe's recovery points). With `durable`, the recovery point
    and the answer are kept in the DB too, for good."""
    if idem_key is None:
        return json_answer(run(Attempt(None, lambda note: None)) if resumable else run(), status)
    scope = key_scope(scope)
    store = idempotency()
    request_fp = fingerprint(route, body)
    begun = store.begin(scope, idem_key, request_fp, durable=durable)
    if begun.status is BeginStatus.TOO_MANY:
        raise errors.TooManyKeys(
            "this caller opened its most Idempotency-Keys for now (MAX_IDEMPOTENCY_KEYS per 24 h): "
            "retry later, or replay a key it holds"
        )
    if begun.status is BeginStatus.REPLAY:
        assert begun.answer_status is not None  # a REPLAY carries the first answer's status and body
        return Response(
            status_code=begun.answer_status,
            content_type="application/json",
            body=begun.body,
            headers={"Idempotent-Replayed": "true"},
        )
    if begun.status is BeginStatus.CONFLICT:
        raise errors.IdempotencyKeyReused("this Idempotency-Key was used with another route or body")
    if begun.status is BeginStatus.RUNNING:
        raise errors.IdempotencyInProgress("the first request with this Idempotency-Key is still in progress")
    if resumable:

        def remember(note: str) -> None:
            if not store.note(scope, idem_key, begun.token, note, durable, request_fp):
                # another attempt took the key over (this one's lease ran out): it alone may act under the key now
                raise errors.IdempotencyInProgress(
                    "this request's hold on its Idempotency-Key ran out and a retry "
                    "took it over; nothing was changed by this request"
                )

        attempt = Attempt(begun.note, remember, begun.retaken, keyed=True)

        def call() -> dict[str, Any]:
            return run(attempt)
    else:
        call = run

    def finish(answer: Response[str]) -> None:
        _finish(scope, idem_key, begun.token, answer, durable, request_fp)

    # a 5xx that changed nothing gives the key back; the recovery point of an attempt that died under it stays (its
    # effect may stand: a resumed voucher order found RECOVERING after a Redis loss is in the DB once the hold passes)
    forget_note = durable and not (resumable and begun.note is not None)
    try:
        answer = json_answer(call(), status)
    except errors.DomainError as exc:
        if not errors.is_key_answer(exc):
            _abandon(
                scope, idem_key, begun.token, forget_note
            )  # nothing changed: not the key's answer, a retry runs again
            raise
        finish(error(exc.status, exc.code, exc.message, **exc.details))
        raise  # answered by the app's handler, with the same body
    except (DatabaseUnavailable, LockUnavailable, RedisUnavailable) as exc:
        # answered 503 SERVICE_UNAVAILABLE (nothing was changed): the key is given back; answered OUTCOME_UNKNOWN
        # (ANSWER_LOST: the change may have been made, with nothing named to look up) it stays in flight until its
        # lease ends, so a retry under it cannot make the change twice meanwhile, then takes it over
        if not isinstance(exc, ANSWER_LOST):
            _abandon(scope, idem_key, begun.token, forget_note)
        raise
    # anything else (a bug, a kill) may come after an effect: the record stays in flight until its lease ends, then a
    # retry takes it over (and a resumable request resumes from the recovery point it left)
    finish(answer)
    return answer


def _finish(scope: str, idem_key: str, token: str, answer: Response[str], durable: bool, request_fp: str) -> None:
    assert answer.body is not None  # json_answer and error always give a body
    try:
        if not idempotency().finish(scope, idem_key, token, answer.status_code, answer.body, durable, request_fp):
            logger.warning("idempotency record taken over before the answer", extra={"scope": scope})
    except (RedisUnavailable, DatabaseUnavailable):
        # the request's effect stands: the record stays in flight until its lease ends, then a retry resumes or runs
        # again (a durable route from the recovery point it left, which finds the effect made)
        logger.warning("idempotency answer not recorded", extra={"scope": scope}, exc_info=True)


def _abandon(scope: str, idem_key: str, token: str, forget_note: bool) -> None:
    with contextlib.suppress(RedisUnavailable, DatabaseUnavailable):
        idempotency().abandon(scope, idem_key, token, forget_note)
