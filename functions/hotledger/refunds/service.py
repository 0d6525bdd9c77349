"""Refunds: give back part or all of one charge (a deduct's order, or what a hold captured), in as many refunds as
wanted, never more than was charged in total, and only of what the ledger's books hold (issue 31, holes 2 and 5):
- a charge is refundable once it is booked in the DB (CHARGE_NOT_BOOKED before): a charge only acknowledged may
  still be taken back (a publish that failed, an outcome unknown the reconciler gives back), and a refund of it
  would then pay out money never charged;
- the service's own charges (keys not a client's: a red packet's debit, a payment order's charge) are not
  refundable here (NOT_REFUNDABLE): their own lifecycle gives them back, as credits this cap would not count.

A refund is a credit of the account, made by ledger_refund.lua in the account's slot in the same step that checks and
raises the charge's refunded total, so concurrent refunds and retries cannot pass the charge (Blnk's users met refunds
that were not idempotent and raced). Like every credit it is spendable once its event is durable. A charge not yet
persisted can be refunded: its amount comes from Redis until the writer books it. The refunded total per charge is
loaded into Redis on first use from the DB plus the refunds still on their way to it.

With an Idempotency-Key (api.idempotency `once`, durable) a refund happens once and its retry answers the first
answer; a retry of a request that died resumes from the refund id it left: looked for in Redis first, then in the
DB (the writer settles in Redis only after its commit, so a refund leaving Redis between the reads is in the DB)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hotledger import errors
from hotledger.grants.rows import encode_spent, refund_parts
from hotledger.grants.tx import live_grant_ids
from hotledger.holds.service import Holds
from hotledger.ledger.entry import Entry, RefundOf, is_client_key
from hotledger.ledger.kinds import KIND_RECHARGE, KIND_REFUND
from hotledger.ledger.rows import AccountRow
from hotledger.ledger.service import Ledger, after_change
from hotledger.ledger.tx import LedgerTx
from hotledger.outbox.durable import Durability, Outbound, Step
from hotledger.outbox.events import LedgerEvent
from hotledger.refunds.replies import RefundReply, RefundStatus
from hotledger.refunds.rows import Refund
from hotledger.refunds.store import RefundStore
from hotledger.refunds.tx import insert_refunds_and_give_backs, refunded_in_tx

ORDER, HOLD = "order", "hold"


@dataclass(frozen=True)
class RefundResult:
    refund: Refund
    balance: int | None  # None: replayed from the DB (a resumed request whose refund stood)


class Refunds:
    def __init__(
        self,
        store: RefundStore,
        durability: Durability,
        ledger: Ledger,
        holds: Holds,
        next_id: Callable[[], int],
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        """ledger: the accounts' service (the charge, loads, take-backs, pending entries); holds: the holds' service."""
        self.store, self.durability, self.ledger, self.holds = store, durability, ledger, holds
        self.next_id, self.clock = next_id, clock

    def refund(
        self,
        user_id: int,
        charge_kind: str,
        charge_id: int,
        amount: int,
        reason: str,
        remember: Callable[[str], object] | None = None,
        resumed_from: str | None = None,
    ) -> RefundResult:
        if resumed_from is not None:
            stood = self._pending(user_id, int(resumed_from)) or self.store.stored(user_id, int(resumed_from))
            if stood is not None:
                return RefundResult(stood, None)
        charged = self._charged(user_id, charge_kind, charge_id)
        spent = self.store.charge_spends(charge_kind, charge_id)  # booked with the charge
        if spent is None:
            # a grant it spent is booked after it (the broker lost its log and the reconciler books the older entry
            # later): refunded now, the grant's part would go back as plain money
            raise _not_booked(charge_kind, charge_id)
        now = self.clock()
        known: list[int | None] = [None]
        spent_field = encode_spent(spent) or ""

        def attempt(refund_id: int) -> RefundReply:
            if remember is not None:
                remember(str(refund_id))
            reply = self.store.refund(
                user_id, refund_id, amount, now, charge_id, charge_kind, charged, known[0], reason, spent_field
            )
            if reply.status is RefundStatus.UNKNOWN_TOTAL:
                known[0] = self._refunded_so_far(user_id, charge_id)
                reply = self.store.refund(
                    user_id, refund_id, amount, now, charge_id, charge_kind, charged, known[0], reason, spent_field
                )
            return reply

        def outbound(refund_id: int, reply: RefundReply) -> Outbound:
            entry = Entry(
                refund_id,
                user_id,
                amount,
                now,
                reply.balance,
                reply.version,
                KIND_REFUND,
                reply.epoch,
                reply.open_flag,
                None,
                refund=RefundOf(charge_id, charge_kind, reply.refunded, reason, reply.grants_refunded),
            )
            return Outbound(
                str(user_id),
                entry.event,
                lambda: self.ledger.take_back(user_id, refund_id, KIND_REFUND),
                made_durable=lambda: self.ledger.post(user_id, refund_id),
            )

        def in_db(tx: LedgerTx, account: AccountRow, now_ms: int) -> LedgerEvent:
            refunded = refunded_in_tx(tx.cursor, charge_id)  # every refund of the charge waits for this row lock
            if refunded + amount > charged:
                raise _exceeds(refunded, charged)
            if account.balance + amount > self.store.max_balance:
                raise errors.BalanceLimit("the refund would take the balance past its largest value")
            # lib/grants grants_refund's rule: a part goes back to its grant only while that grant is live
            parts = refund_parts(spent, charged, refunded, amount)
            live = live_grant_ids(tx.cursor, [g for g, _ in parts], now_ms)
            given = [(g, a) for g, a in parts if g in live]
            return LedgerEvent(
                type="ledger",
                id=refund_id,
                kind=KIND_REFUND,
                user_id=user_id,
                amount=amount,
                balance_after=account.balance + amount,
                version=account.version + 1,
                epoch="",
                ts=now_ms,
                open=after_change(KIND_RECHARGE, account.balance + amount, account.open_flag),
                refund_of=charge_id,
                refund_of_kind=charge_kind,
                refunded_after=refunded + amount,
                reason=reason,
                grants_refunded=encode_spent(given),
            )

        while True:
            refund_id, reply = self.durability.apply(
                Step(
                    what="refund",
                    attempt=attempt,
                    reload=lambda: self.ledger.load_cache(user_id),
                    refusal=self._refusal,
                    outbound=lambda i, r: outbound(i, r) if r.status is RefundStatus.OK else None,
                    unknown=lambda i, why: errors.ChargeOutcomeUnknown(
                        f"{why}: refund {i} may or may not be made; look at GET /accounts/{user_id}/entries before retrying "
                        "(or retry with the same Idempotency-Key)",
                        entry_id=str(i),
                    ),
                )
            )
            if reply.status is RefundStatus.SYNC:
                change = self.ledger.change_in_db(user_id, refund_id, in_db, insert_refunds_and_give_backs)
                if change is None:
                    continue  # ASYNC after all: the stale cache was dropped
                return RefundResult(
                    Refund(refund_id, user_id, charge_id, charge_kind, amount, change.refunded_after),
                    change.balance_after,
                )
            return RefundResult(
                Refund(refund_id, user_id, charge_id, charge_kind, amount, reply.refunded), reply.balance
            )

    def _charged(self, user_id: int, charge_kind: str, charge_id: int) -> int:
        """What the charge took, as the books hold it (raises ORDER_NOT_FOUND / HOLD_NOT_FOUND for one that is not
        this account's, CHARGE_NOT_BOOKED / NOT_REFUNDABLE / HOLD_NOT_ENDED for one not refundable now)."""
        if charge_kind == ORDER:
            booked = self.store.booked_deduct(user_id, charge_id)
            if booked is None:
                self.ledger.get_deduct(user_id, charge_id)  # ORDER_NOT_FOUND when it is nowhere
                raise _not_booked(charge_kind, charge_id)
            amount, idem_key = booked
            if idem_key is not None and not is_client_key(idem_key):
                raise errors.NotRefundable(
                    f"order {charge_id} is the service's own charge (a red packet's debit or a payment order's): its "
                    "own refund gives it back"
                )
            return amount
        if self.holds.get(user_id, charge_id).state == "ACTIVE":
            raise errors.HoldNotEnded("capture the rest or void the hold before refunding what it captured")
        hold = self.holds.booked(user_id, charge_id)
        if hold is None or hold.state == "ACTIVE" or self._changes_on_their_way(user_id, charge_id):
            raise _not_booked(charge_kind, charge_id)
        if hold.captured == 0:
            raise errors.RefundExceedsCharge("the hold captured nothing: there is nothing to refund")
        return hold.captured

    def _changes_on_their_way(self, user_id: int, hold_id: int) -> bool:
        """Whether a change of the hold is still on its way to the DB after the one that ended it was booked: after
        the broker lost its log, the reconciler books older changes (its authorize, a partial capture) later. What the
        hold captured, and of which grants, is in the books only then (and the books refuse a refund of a hold whose
        authorize they do not hold: refunds/tx.py)."""
        return any(e.hold is not None and e.hold.hold_id == hold_id for e in self.ledger.pending_entries(user_id))

    def _refunded_so_far(self, user_id: int, charge_id: int) -> int:
        """The DB's total plus the refunds of this charge still on their way to it."""
        in_db, booked = self.store.refunded_in_db(charge_id)
        return in_db + sum(
            e.amount
            for e in self.ledger.pending_entries(user_id)
            if e.refund is not None and e.refund.charge_id == charge_id and e.entry_id not in booked
        )

    def _pending(self, user_id: int, refund_id: int) -> Refund | None:
        for e in self.ledger.pending_entries(user_id):
            if e.entry_id == refund_id and e.refund is not None:
                return Refund(
                    refund_id, user_id, e.refund.charge_id, e.refund.charge_kind, e.amount, e.refund.refunded_after
                )
        return None

    @staticmethod
    def _refusal(reply: RefundReply) -> errors.DomainError | None:
        if reply.status is RefundStatus.EXCEEDS:
            return _exceeds(reply.refunded, reply.charged)
        if reply.status is RefundStatus.LIMIT:
            return errors.BalanceLimit("the refund would take the balance past its largest value")
        return None  # OK, or SYNC: the DB decides (Ledger.change_in_db)


def _not_booked(charge_kind: str, charge_id: int) -> errors.DomainError:
    return errors.ChargeNotBooked(
        f"{charge_kind} {charge_id} is not in the ledger's books yet: a refund covers only what is booked; retry "
        "in a few seconds"
    )


def _exceeds(refunded: int, charged: int) -> errors.DomainError:
    return errors.RefundExceedsCharge(
        f"{refunded} of the {charged} minor units charged were refunded already: this refund would pass the charge"
    )
