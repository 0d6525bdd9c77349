"""Ledger: what runs inside a DB transaction (row locks, inserts)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hotledger import errors
from hotledger.grants.rows import Grant
from hotledger.grants.tx import active_grants, active_grants_read, booked_spends, grants_of, insert_grant_changes
from hotledger.holds.rows import Hold
from hotledger.holds.tx import active_holds, expired_on_hold, expired_on_hold_read
from hotledger.ledger.entry import Booked, LedgerHead
from hotledger.ledger.kinds import APPLIED_KINDS, ENTRY_TABLES
from hotledger.ledger.rows import AccountMove, AccountRow, IdempotentAnswer, LockedAccount, open_columns
from hotledger.outbox.events import LedgerEvent

if TYPE_CHECKING:
    # a transaction's cursor (re-exported: the services name it without importing the driver)
    from pymysql.cursors import Cursor as Cursor

    from hotledger.dal.db import SqlArgs

# kind -> (table, amount column): where the writer keeps each booked change by its id (its ledger row is in t_entry)
ACCOUNT_SELECT = (
    "SELECT u.id, u.user_name, u.deduct_type, a.balance, a.version, a.threshold, a.seq, a.on_hold, a.booked_at,"
    " u.api_open, u.close_reason"
    " FROM t_user u JOIN t_account a ON a.user_id = u.id WHERE u.id = %s"
)


@dataclass
class Booking:
    """Ledger rows as the booking transaction hands them to its subscribers (hotledger.features: Feature.on_booked),
    inside that transaction: what a subscriber writes with `cursor` exists exactly when the rows do."""

    cursor: Cursor
    rows: list[Booked]
    # what a subscriber made of the rows for the later ones, in registry order: the balance monitors' crossings,
    # which the webhooks send as events of their own
    raised: list[object] = field(default_factory=list)
    # what subscribers read already in this transaction, by feature name (Feature.booking_read: a SYNC charge reads
    # them in its first round trip, before its writes go out in one batch that cannot read)
    prefetched: dict[str, Sequence[Sequence[Any]]] = field(default_factory=dict)


OnBooked = Callable[[Booking], None]
# the reads a SYNC charge makes for the subscribers of one account's booking: [(feature name, (sql, args))]
BookingReads = Callable[[int], "list[tuple[str, tuple[str, Any]]]"]


# a SYNC charge's row lock, whose locking read returns the account row as it is now (as a later consistent read
# would: no one else writes it while the lock is held), so the lock and the account's columns are one result set
LOCK_ACCOUNT_SELECT = (
    "SELECT balance, version, threshold, seq, on_hold, booked_at FROM t_account WHERE user_id = %s FOR UPDATE"
)
ANSWER_SELECT = "SELECT fingerprint, response FROM t_idempotency WHERE user_id = %s AND idem_key = %s"


@dataclass(frozen=True)
class ChargeReads:
    """What a SYNC charge reads in its transaction's first round trip, under the account's row lock (taken by the
    first read): the account (None: there is none), the key's answer, what expired holds keep, and what the
    bookings' subscribers read (their Feature.booking_read: the balance monitors, locked too; the subscribed event
    types), by feature name."""

    account: AccountRow | None
    answer: IdempotentAnswer | None
    expired_on_hold: int
    grants: list[Grant]  # ACTIVE with something left, expired ones too (grants.rows)
    prefetched: dict[str, Sequence[Sequence[Any]]]

    @staticmethod
    def statements(
        user_id: int, idem_key: str | None, now_ms: int, subscribers: list[tuple[str, tuple[str, Any]]]
    ) -> list[tuple[str, SqlArgs]]:
        """The reads, the row lock first (its locking read returns the t_account columns; the reads after it see
        every commit before it: a switch of mode takes the same row lock). The t_user columns and what expired holds
        keep are one result set: each result set costs the client's parsing under the lock."""
        expired_sql, expired_args = expired_on_hold_read(user_id, now_ms)
        return [
            (LOCK_ACCOUNT_SELECT, (user_id,)),
            (
                f"SELECT id, user_name, deduct_type, api_open, close_reason, ({expired_sql}) FROM t_user WHERE id = %s",
                (*expired_args, user_id),
            ),
            active_grants_read(user_id),
            *(read for _, read in subscribers),
            *([(ANSWER_SELECT, (user_id, idem_key))] if idem_key else []),
        ]

    @classmethod
    def of(cls, results: Sequence[Sequence[Sequence[Any]]], subscribers: list[str]) -> ChargeReads:
        """The reads from the statements' rows, in their order; subscribers: the names of theirs, in order."""
        locked, user, grants, *rest = results
        answer = rest[len(subscribers) :]
        seen = answer[0] if answer and answer[0] else None
        account, expired = None, 0
        if locked and user:
            user_id, user_name, deduct_type, api_open, reason, expired = user[0]
            account = AccountRow.of((user_id, user_name, deduct_type, *locked[0], api_open, reason))
        return cls(
            account,
            None if seen is None else IdempotentAnswer(seen[0][0], json.loads(seen[0][1])),
            int(expired),
            grants_of(account.user_id, grants) if account else [],
            dict(zip(subscribers, rest[: len(subscribers)], strict=True)),
        )

    @property
    def live_on_hold(self) -> int:
        """What the account's holds keep, less those past expires_at (LedgerTx.live_on_hold)."""
        assert self.account is not None
        return self.account.on_hold - self.expired_on_hold if self.account.on_hold > 0 else 0


class LedgerTx:
    """One DB transaction of the ledger (LedgerStore.transaction()), or the writes of a batched one (db.Batch)."""

    def __init__(self, cursor: Cursor, on_booked: OnBooked) -> None:
        self.cursor = cursor  # for the outbox's dead letters, written in the same transaction
        self.on_booked = on_booked  # the registered features' subscribers to bookings (balance monitors, webhooks)

    def lock_account(self, user_id: int, fence: int, owner: str) -> AccountRow | None:
        """Lock the account row, then read it. `fence` is the distributed lock's token, `owner` its holder: a
        smaller token than the row has seen, or the same one from another holder (handed out twice by a Redis that
        lost the last acquisition), means a newer owner wrote or may write, so this caller must not."""
        cur = self.cursor
        cur.execute("SELECT fence, fence_owner FROM t_account WHERE user_id = %s FOR UPDATE", (user_id,))
        seen = cur.fetchone()
        if seen is not None and (seen[0] > fence or (seen[0] == fence and seen[1] not in (None, owner))):
            raise errors.FencedOut(
                "this request's hold on the account lock ran out and a newer one wrote first; "
                "nothing was changed, retry"
            )
        if seen is not None and (seen[0] < fence or seen[1] is None):
            cur.execute("UPDATE t_account SET fence = %s, fence_owner = %s WHERE user_id = %s", (fence, owner, user_id))
        cur.execute(ACCOUNT_SELECT, (user_id,))
        row = cur.fetchone()
        return None if row is None else AccountRow.of(row)

    def lock_balance(self, user_id: int) -> tuple[int, int]:
        """Lock the account row; (balance, version)."""
        self.cursor.execute("SELECT balance, version FROM t_account WHERE user_id = %s FOR UPDATE", (user_id,))
        balance, version = self.cursor.fetchone()
        return int(balance), int(version)

    def lock_accounts(self, user_ids: set[int]) -> dict[int, LockedAccount]:
        """Lock the accounts in id order (no deadlock between writers); user_id -> version and ledger head of those
        that exist."""
        if not user_ids:
            return {}
        ordered = sorted(user_ids)
        self.cursor.execute(
            f"SELECT user_id, version, seq, balance, on_hold, booked_at FROM t_account"
            f" WHERE user_id IN ({_ints(ordered)}) ORDER BY user_id FOR UPDATE"
        )
        return {row[0]: LockedAccount(row[1], LedgerHead(*row[2:])) for row in self.cursor.fetchall()}

    def stored_entries(self, ids_and_kinds: list[tuple[int, str]]) -> dict[int, tuple[int, int, int]]:
        """Entry id -> (user_id, amount, version) for those of the (id, kind) pairs the DB holds
        (each kind's table: ENTRY_TABLES)."""
        found: dict[int, tuple[int, int, int]] = {}
        for table, amount_col in set(ENTRY_TABLES.values()):
            ids = [entry_id for entry_id, entry_kind in ids_and_kinds if ENTRY_TABLES[entry_kind][0] == table]
            if ids:
                self.cursor.execute(
                    f"SELECT id, user_id, {amount_col}, version FROM {table} WHERE id IN ({_ints(ids)})"
                )
                found.update((row[0], tuple(row[1:])) for row in self.cursor.fetchall())
        return found

    def active_holds(self, user_id: int) -> list[Hold]:
        """The account's ACTIVE holds as the DB holds them (under the row lock this transaction took; holds.tx)."""
        return active_holds(self.cursor, user_id)

    def active_grants(self, user_id: int) -> list[Grant]:
        """The account's ACTIVE credit grants with something left, as the DB holds them (under the row lock)."""
        return active_grants(self.cursor, user_id)

    def booked_spends(self, grant_ids: list[int]) -> dict[int, int]:
        return booked_spends(self.cursor, grant_ids)

    def insert_grant_changes(self, changes: list[LedgerEvent]) -> None:
        """What SYNC changes do to the account's grants (grants.tx)."""
        insert_grant_changes(self.cursor, changes)

    def live_on_hold(self, account: AccountRow, now_ms: int) -> int:
        """What the account's holds keep, less those past expires_at (as the scripts count it)."""
        return account.on_hold - expired_on_hold(self.cursor, account.user_id, now_ms) if account.on_hold > 0 else 0

    def book_change(self, account: AccountRow, booked: Booked, head: LedgerHead, open_flag: str) -> None:
        """A SYNC change of another feature (a hold's, a refund): its ledger row and the account row after it."""
        self.insert_booked([booked])
        self.cursor.execute(
            "UPDATE t_account SET balance = %s, version = version + 1, seq = %s, on_hold = %s,"
            " booked_at = %s WHERE user_id = %s",
            (head.balance, head.seq, head.on_hold, head.booked_at, account.user_id),
        )
        if open_flag != account.open_flag:
            self.set_open(account.user_id, open_flag)

    def rolled_back(self, entry_ids: list[int]) -> set[int]:
        """Those of the ids the API rolled back for good (t_rolled_back), read under the account row locks the
        caller holds: the API records a rollback under the same lock, so the two cannot both win."""
        if not entry_ids:
            return set()
        self.cursor.execute(f"SELECT change_id FROM t_rolled_back WHERE change_id IN ({_ints(entry_ids)})")
        return {row[0] for row in self.cursor.fetchall()}

    def idempotent_answer(self, user_id: int, idem_key: str) -> IdempotentAnswer | None:
        """The first answer given for this key, read under the account's row lock (taken here first), as every writer
        of an account's answers holds it: the key is not locked itself, since a locking read of a key not there yet
        locked the gap around it, and SYNC charges of other accounts inserting their keys there waited or deadlocked."""
        self.cursor.execute("SELECT 1 FROM t_account WHERE user_id = %s FOR UPDATE", (user_id,))
        self.cursor.execute(ANSWER_SELECT, (user_id, idem_key))
        seen = self.cursor.fetchone()
        return None if seen is None else IdempotentAnswer(seen[0], json.loads(seen[1]))

    def remember_answer(self, user_id: int, idem_key: str, fingerprint: str, answer: dict[str, Any]) -> None:
        self.cursor.execute(
            "INSERT INTO t_idempotency (user_id, idem_key, fingerprint, response) VALUES (%s, %s, %s, %s)",
            (user_id, idem_key, fingerprint, json.dumps(answer)),
        )

    def idempotent_answers(self, pairs: list[tuple[int, str]]) -> dict[tuple[int, str], IdempotentAnswer]:
        """(user_id, idem_key) -> the answer the DB holds, for those of the pairs it holds. Read under the caller's
        account row locks, not locked itself: every writer of an account's answers but one holds its row lock first
        (the writer and the reconciler through it, the SYNC path), and that one, the API's refusal (INSERT IGNORE),
        is replaced by the writer's answer whether it lands before or after this read. Locking the keys (FOR UPDATE)
        also locked the gaps around the keys not there yet, and partition writers inserting their own accounts' keys
        into each other's gaps deadlocked (MySQL 1213), so their batches were retried."""
        if not pairs:
            return {}
        self.cursor.execute(
            "SELECT user_id, idem_key, fingerprint, response FROM t_idempotency WHERE (user_id, idem_key)"
            f" IN ({','.join(['(%s, %s)'] * len(pairs))})",
            [x for pair in pairs for x in pair],
        )
        return {(row[0], row[1]): IdempotentAnswer(row[2], json.loads(row[3])) for row in self.cursor.fetchall()}

    def remember_answers(self, answers: list[tuple[int, str, str, dict[str, Any]]]) -> None:
        """(user_id, idem_key, fingerprint, answer) each, in one statement; an answer already held is replaced
        (the writer replaces only a refusal, by the charge that was made before it)."""
        if answers:
            self.cursor.execute(
                "INSERT INTO t_idempotency (user_id, idem_key, fingerprint, response) VALUES "
                + ",".join(["(%s, %s, %s, %s)"] * len(answers))
                + " ON DUPLICATE KEY UPDATE fingerprint = VALUES(fingerprint), response = VALUES(response)",
                [x for user_id, key, fp, answer in answers for x in (user_id, key, fp, json.dumps(answer))],
            )

    def raise_version(self, user_id: int, version: int) -> None:
        self.cursor.execute(
            "UPDATE t_account SET version = GREATEST(version, %s) WHERE user_id = %s", (version, user_id)
        )

    def set_threshold(self, user_id: int, threshold: int) -> None:
        self.cursor.execute("UPDATE t_account SET threshold = %s WHERE user_id = %s", (threshold, user_id))

    def set_deduct_type(self, user_id: int, deduct_type: str) -> None:
        self.cursor.execute("UPDATE t_user SET deduct_type = %s WHERE id = %s", (deduct_type, user_id))

    def set_open(self, user_id: int, flag: str) -> None:
        self.cursor.execute(
            "UPDATE t_user SET api_open = %s, close_reason = %s WHERE id = %s", (*open_columns(flag), user_id)
        )

    def insert_sync_entry(
        self,
        kind: str,
        entry_id: int,
        user_id: int,
        amount: int,
        balance: int,
        version: int,
        idem_key: str | None,
        booked: Booked,
        reads: ChargeReads,
    ) -> None:
        """A SYNC charge: its row in its kind's table, its ledger row (judged by the monitors and sent to the webhooks
        `reads` holds), and the account row after it: balance, version and ledger head."""
        # rendered under the row lock: the ints formatted directly, as _entry_values does, the rest escaped
        escape = self.cursor.connection.escape
        self.cursor.execute(
            _insert_entries(kind)
            + "(%d,%d,%d,%d,%d,'SYNC',%s,%s)"
            % (
                entry_id,
                user_id,
                amount,
                balance,
                version,
                escape(idem_key),
                escape(datetime.now(UTC).replace(tzinfo=None)),
            )
        )
        self.insert_booked([booked], reads.prefetched)
        self.cursor.execute(
            "UPDATE t_account SET balance = %d, version = %d, seq = %d, booked_at = %d WHERE user_id = %d"
            % (balance, version, booked.seq, booked.booked_at, user_id)
        )

    def insert_booked(self, rows: list[Booked], prefetched: dict[str, Sequence[Sequence[Any]]] | None = None) -> None:
        """Ledger rows (t_entry), one statement, with what their subscribers make of them in the same transaction (the
        balance monitors' crossings, the webhook events): an event exists exactly when its change is booked.
        prefetched: what the subscribers read in this transaction already (ChargeReads), by feature name."""
        if rows:
            self.on_booked(Booking(self.cursor, rows, prefetched=prefetched or {}))
            escape = self.cursor.connection.escape
            self.cursor.execute(
                "INSERT INTO t_entry (user_id, seq, entry_id, type, amount, delta, balance_after, available_after,"
                " booked_at, charged_at, ref) VALUES "
                + ",".join(
                    "(%d,%d,%d,%s,%d,%d,%d,%d,%d,%d,%s)"
                    % (
                        r.user_id,
                        r.seq,
                        r.entry_id,
                        escape(r.type),
                        r.amount,
                        r.delta,
                        r.balance_after,
                        r.available_after,
                        r.booked_at,
                        r.charged_at,
                        "NULL" if r.ref is None else escape(r.ref),
                    )
                    for r in rows
                )
            )

    def insert_events(self, events: list[LedgerEvent]) -> None:
        """ASYNC changes of the applied kinds (deducts, recharges, ...), one multi-row INSERT per kind (a hold's
        changes: holds.store)."""
        for kind in APPLIED_KINDS:
            values = [self._entry_values(e) for e in events if e.kind == kind]
            if values:
                self.cursor.execute(_insert_entries(kind) + ",".join(values))

    def _entry_values(self, e: LedgerEvent) -> str:
        # every value but the key is a validated int: formatting them directly is ~15x cheaper than the driver's
        # escaping, which matters at tens of thousands of rows per second; the key is escaped by the driver
        idem_key = "NULL" if e.idem_key is None else self.cursor.connection.escape(e.idem_key)
        return "(%d,%d,%d,%d,%d,'ASYNC',%s,FROM_UNIXTIME(%d/1000))" % (
            e.id,
            e.user_id,
            e.amount,
            e.balance_after,
            e.version,
            idem_key,
            e.ts,
        )

    def move_accounts(self, moves: list[AccountMove]) -> None:
        """Add each move's delta to its balance and raise its version (never lower it), in one statement; then
        the open flags, one statement per distinct flag."""
        if not moves:
            return
        self.cursor.execute(
            "INSERT INTO t_account (user_id, balance, version, seq, on_hold, booked_at) VALUES "
            + ",".join(
                "(%d,%d,%d,%d,%d,%d)" % (m.user_id, m.delta, m.version, m.head.seq, m.head.on_hold, m.head.booked_at)
                for m in moves
            )
            + " ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance), version = GREATEST(version, VALUES(version)),"
            " seq = VALUES(seq), on_hold = VALUES(on_hold), booked_at = VALUES(booked_at)"
        )
        # one UPDATE per distinct (api_open, close_reason), nearly always one (all open): a CASE on the id per row makes
        # the DB match every row against every WHEN (19 ms of MariaDB's CPU for a batch of 1,000, 60 ms for 2,000)
        by_flag: dict[tuple[int, str | None], list[int]] = defaultdict(list)
        for m in moves:
            if m.open_flag is not None:
                by_flag[open_columns(m.open_flag)].append(m.user_id)
        for (api_open, reason), user_ids in by_flag.items():
            self.cursor.execute(
                f"UPDATE t_user SET api_open = %s, close_reason = %s WHERE id IN ({_ints(sorted(user_ids))})",
                (api_open, reason),
            )


def _insert_entries(kind: str) -> str:
    table, amount_col = ENTRY_TABLES[kind]
    return f"INSERT INTO {table} (id, user_id, {amount_col}, balance, version, mode, idem_key, create_time) VALUES "


def _ints(values: Iterable[int]) -> str:
    """An IN list of ints, formatted directly (%d refuses anything but a number): the driver's escaping of a
    thousand ids costs more than the query."""
    return ",".join(["%d" % v for v in values])
