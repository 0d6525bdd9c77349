"""Transfers: money from one account (the payer) to another (the payee) of the same currency.

The two accounts usually live in different Redis Cluster slots, so no one script sees both: a transfer is two ledger
charges, each under the transfer's own Idempotency-Key (store.py: ServiceKey, so repeating a step replays it), and a
t_transfer row that says how far it got:

  PENDING   the row is in; the payer's debit (kind T under transferdebit<id>: plain money only, its credit grants
            out of reach) is being made
  DEBITED   the debit is durable (the broker acknowledged its event, or the DB committed it: ledger.charge answered):
            the amount left the payer (spendable by no one) and is in flight
  CREDITED  the payee's credit (a recharge under transfercredit<id>) is durable too
  POSTED    both legs are booked in the DB (t_order / t_pay and their t_entry rows)
  RELEASING the credit was refused for good (the payee at the balance limit): the debit is being given back
            (a recharge of the payer under transferrelease<id>)
  FAILED    the debit was refused (the payer's code: INSUFFICIENT_BALANCE, API_CLOSED, ...), or it was given back

Who moves it: the request (as far as it gets), then the `transfer-post` delay queue (every second or two until the
transfer is POSTED or FAILED), and the reconciler's `transfers` part (transfers left in a state past RECONCILE_AGE_S:
a request that died, a queue element lost). Every step repeats safely: the ledger replays a charge made under its key.

Invariants:
- the credit is made only once the debit is durable (ledger.charge answered), so no money is ever in two places;
- a transfer moves plain money only: the debit (ledger/kinds.py T, plain_only) is refused above available less the
  payer's live grants and spends none, so the payee never receives promo credit as money, nor the payer on a release;
- the sum of all balances plus what DEBITED and RELEASING transfers hold is constant (between a leg's charge and the
  row's move, the ledger's keys say which legs exist: a debit under transferdebit<id> with neither a credit nor a
  release is in flight);
- only a definitive refusal fails a debit (ledger's answer 'not made'); an unknown outcome leaves the transfer PENDING
  for the reconciler, which runs the debit again under the same key (it either exists already or is made once);
- a credit is given up (RELEASING) only on a refusal that stands (BALANCE_LIMIT, the payee gone), never on a failure
  that may pass, and only by the one actor working on the transfer then: the request within its lifetime, later the
  queue or the reconciler, which take it over only once it is older than the request can live.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from hotledger import errors
from hotledger.currencies.service import Currencies, minor_in
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.delay_queue import DelayQueue
from hotledger.dal.redis_store import RedisUnavailable
from hotledger.ledger.kinds import KIND_RECHARGE, KIND_TRANSFER_DEBIT
from hotledger.transfers.rows import CREDITED, DEBITED, FAILED, FINAL, PENDING, POSTED, RELEASING, Transfer
from hotledger.transfers.store import TransferStore, credit_key, debit_key, release_key

if TYPE_CHECKING:
    from hotledger.ledger.rows import AccountRow
    from hotledger.ledger.service import KeyedCharge, LedgerResult

TRANSFER_POST = "transfer-post"
POST_RETRY_MS = 1000
LEDGER_FAILURES = (errors.DomainError, RedisUnavailable, DatabaseUnavailable)


class Ledger(Protocol):
    """What transfers use of the ledger's service."""

    def charge(self, kind: str, user_id: int, amount: int, idem_key: str | None) -> LedgerResult: ...

    def recharge(self, user_id: int, amount: int, idem_key: str | None = None) -> LedgerResult: ...

    def charged_with(self, kind: str, user_id: int, idem_key: str) -> KeyedCharge | None: ...

    def account_row(self, user_id: int) -> AccountRow | None: ...


def _debit_not_made(exc: errors.DomainError) -> bool:
    """A definitive 'the debit was not made' (redpackets.service._debit_not_made's rule): the ledger's refusals and
    the 503s that changed nothing; not OUTCOME_UNKNOWN, IDEMPOTENCY_IN_PROGRESS or RECOVERING."""
    if isinstance(exc, (errors.ChargeOutcomeUnknown, errors.IdempotencyInProgress, errors.Recovering)):
        return False
    return exc.status < 500 or isinstance(exc, (errors.PublishFailed, errors.ServiceUnavailable, errors.FencedOut))


def _may_pass(exc: errors.DomainError) -> bool:
    """A refusal that changed nothing and may go otherwise on a retry (a backlog, a dependency): not the transfer's
    fate."""
    return exc.status in (429, 503) or isinstance(exc, errors.Recovering)


def _credit_refused_for_good(exc: errors.DomainError) -> bool:
    return isinstance(exc, (errors.BalanceLimit, errors.AccountNotFound))


def _unknown(transfer_id: int, why: str) -> errors.DomainError:
    return errors.ChargeOutcomeUnknown(
        f"{why}: transfer {transfer_id} may or may not have debited the payer. Check GET /transfers/{transfer_id}: it"
        " goes on (or fails, if the debit was not made) by itself; retry with the same Idempotency-Key to resume it",
        transfer_id=str(transfer_id),
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


class Transfers:
    def __init__(
        self,
        store: TransferStore,
        ledger: Ledger,
        currencies: Currencies,
        queue: DelayQueue,
        next_id: Callable[[], int],
        takeover_ms: int,
        clock: Callable[[], int] = _now_ms,
    ):
        """takeover_ms: how long after a transfer's last move the queue takes it over from the request that moved
        it (above the API function's timeout: IDEMPOTENCY_LEASE_MS), so only one actor charges its legs at a time."""
        self.store, self.ledger, self.currencies, self.queue = store, ledger, currencies, queue
        self.next_id, self.takeover_ms, self.clock = next_id, takeover_ms, clock

    # create -----------------------------------------------------------------------------------------------
    def create(
        self,
        from_id: int,
        to_id: int,
        amount: Decimal,
        description: str = "",
        reserve: Callable[[int], object] | None = None,
        transfer_id: int | None = None,
    ) -> Transfer:
        """Check the transfer (a 4xx changes nothing), keep its row PENDING and move it as far as it goes now.
        `reserve(transfer_id)` runs before any effect (the Idempotency-Key's recovery point: resume)."""
        if from_id == to_id:
            raise errors.SameAccount("a transfer moves money between two accounts: from and to are the same")
        payer, payee = self.currencies.of(from_id), self.currencies.of(to_id)  # ACCOUNT_NOT_FOUND
        if payer != payee:
            raise errors.CurrencyMismatch(
                f"account {from_id} holds {payer.code} and account {to_id} {payee.code}: transfers stay in one currency"
            )
        minor = minor_in(payer, amount)
        payee_row = self.ledger.account_row(to_id)
        if payee_row is None:
            raise errors.AccountNotFound(f"account {to_id} does not exist")
        if payee_row.open_flag == "ADMIN":
            raise errors.AccountClosed(f"account {to_id} was closed by an operator: it takes no transfers")
        transfer_id = transfer_id or self.next_id()
        if reserve is not None:
            reserve(transfer_id)
        now = self.clock()
        row = Transfer(
            transfer_id, from_id, to_id, minor, payer.code, description, PENDING, created_at=now, updated_at=now
        )
        if not self.store.insert(row):
            return self.resume(transfer_id, from_id, to_id, amount, description)
        return self.advance(row, first_debit=True)

    def resume(self, transfer_id: int, from_id: int, to_id: int, amount: Decimal, description: str) -> Transfer:
        """Go on with the transfer an attempt that died began under the same Idempotency-Key: create it if it was
        never inserted, else move it on (a FAILED one answers its failure again)."""
        row = self.store.get(transfer_id)
        if row is None:
            return self.create(from_id, to_id, amount, description, transfer_id=transfer_id)
        if row.state == FAILED and row.debit_id is None:
            raise errors.TransferFailed(f"transfer {transfer_id} failed: {row.failure}")
        return self.advance(row)

    # moves ------------------------------------------------------------------------------------------------
    def advance(self, row: Transfer, first_debit: bool = False) -> Transfer:
        """Move the transfer as far as it goes now; what is not final then is looked at again by the transfer-post
        queue (and the reconciler)."""
        try:
            if row.state == PENDING:
                row = self._debit(row, first_debit)
            if row.state == DEBITED:
                row = self._credit(row)
            if row.state == RELEASING:
                row = self._release(row)
            if row.state == CREDITED:
                row = self._post(row)
        except Exception:
            # discarded, FAILED, or left where the failure stopped it (the DB down too: the reconciler's scan)
            with contextlib.suppress(DatabaseUnavailable):
                now = self.store.get(row.transfer_id)
                if now is not None and now.state not in FINAL:
                    self._look_again(row.transfer_id)
            raise
        if row.state not in FINAL:
            self._look_again(row.transfer_id)
        return row

    def _look_again(self, transfer_id: int) -> None:
        with contextlib.suppress(errors.DomainError, RedisUnavailable):  # the reconciler's scan is the safety net
            self.queue.offer(TRANSFER_POST, str(transfer_id), delay_ms=POST_RETRY_MS)

    def _debit(self, row: Transfer, first_debit: bool) -> Transfer:
        tid = row.transfer_id
        try:
            debit = self.ledger.charge(KIND_TRANSFER_DEBIT, row.from_id, row.amount, debit_key(tid))
        except errors.DomainError as exc:
            if first_debit and (_may_pass(exc) and _debit_not_made(exc) or isinstance(exc, errors.Recovering)):
                # nothing was ever charged under its key: gone, as if never asked (a retry under the request's
                # Idempotency-Key makes it anew)
                self.store.discard(tid)
                raise
            if _debit_not_made(exc) and not _may_pass(exc):
                self.store.move(tid, PENDING, FAILED, self.clock(), failure=f"{exc.code}: {exc.message}"[:300])
                raise
            raise _unknown(tid, exc.message) from exc
        except Exception as exc:
            raise _unknown(tid, f"the ledger failed ({type(exc).__name__}: {exc})") from exc
        now = self.clock()
        if not self.store.move(tid, PENDING, DEBITED, now, debit_id=debit.entry_id):
            # another actor moved it meanwhile: go on from where it is (FAILED on a refusal it met: the debit this
            # attempt made after all is given back by the reconciler, store.failed_with_debit)
            return self._current(row)
        return _with(row, DEBITED, now, debit_id=debit.entry_id)

    def _credit(self, row: Transfer) -> Transfer:
        tid = row.transfer_id
        try:
            credit = self.ledger.recharge(row.to_id, row.amount, credit_key(tid))
        except errors.DomainError as exc:
            if not _credit_refused_for_good(exc):
                return row  # DEBITED: in flight, credited by a later look
            failure, now = f"{exc.code}: {exc.message}"[:300], self.clock()
            self.store.move(tid, DEBITED, RELEASING, now, failure=failure)
            return _with(row, RELEASING, now, failure=failure)
        except (RedisUnavailable, DatabaseUnavailable):
            return row
        now = self.clock()
        if not self.store.move(tid, DEBITED, CREDITED, now, credit_id=credit.entry_id):
            return self._current(row)  # RELEASING: _release finds this credit and takes the transfer to CREDITED
        return _with(row, CREDITED, now, credit_id=credit.entry_id)

    def _release(self, row: Transfer) -> Transfer:
        tid = row.transfer_id
        credited = self.ledger.charged_with(KIND_RECHARGE, row.to_id, credit_key(tid))
        if credited is not None:  # an attempt that stalled past the refusal credited the payee after all: it stands
            now = self.clock()
            if self.store.move(tid, row.state, CREDITED, now, credit_id=credited.entry_id, failure=None):
                return _with(row, CREDITED, now, credit_id=credited.entry_id, failure=None)
            return self._current(row)
        try:
            release = self.ledger.recharge(row.from_id, row.amount, release_key(tid))
        except LEDGER_FAILURES:
            return row
        now = self.clock()
        self.store.move(tid, row.state, FAILED, now, release_id=release.entry_id)
        return _with(row, FAILED, now, release_id=release.entry_id)

    def _current(self, row: Transfer) -> Transfer:
        return self.store.get(row.transfer_id) or row

    def _post(self, row: Transfer) -> Transfer:
        if not self.store.booked(row):
            return row
        now = self.clock()
        self.store.move(row.transfer_id, CREDITED, POSTED, now)
        return _with(row, POSTED, now)

    def release_failed_debit(self, row: Transfer) -> bool:
        """A FAILED transfer whose payer was debited after all (store.failed_with_debit) gives the debit back."""
        return self._release(row).release_id is not None

    def look_again_due(self, transfer_ids: list[str]) -> None:
        """transfer-post queue handler: move each transfer on; what is not final yet is offered again."""
        for transfer_id in transfer_ids:
            row = self.store.get(int(transfer_id))
            if row is None or row.state in FINAL:
                continue
            if row.state != CREDITED and row.updated_at > self.clock() - self.takeover_ms:
                self._look_again(row.transfer_id)  # its request may still be charging a leg: not yet
                continue
            try:
                self.advance(row)
            except LEDGER_FAILURES:
                self._look_again(row.transfer_id)

    # read -------------------------------------------------------------------------------------------------
    def get(self, transfer_id: int) -> Transfer:
        row = self.store.get(transfer_id)
        if row is None:
            raise errors.TransferNotFound(f"transfer {transfer_id} does not exist")
        if row.state == CREDITED:  # booked since: say so now, not at the queue's next look
            row = self._post(row)
        return row

    def in_flight(self) -> int:
        return self.store.in_flight()


def _with(row: Transfer, state: str, at: int, **fields: Any) -> Transfer:
    """The row as store.move left it: in `state` since `at` (its updated_at), with the fields given."""
    return replace(row, state=state, updated_at=at, **fields)
