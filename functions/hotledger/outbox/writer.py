"""Batch writer: events -> MySQL, exactly once. Ledger events are handled here; voucher orders and red
packet claims by their own persisters (logic/seckill.py, logic/redpackets.py), each in its own transaction.

One transaction per batch: the touched accounts are locked, entries the DB already holds are
skipped (a replay changes nothing), the rest go in with multi-row INSERTs, and each account moves by
the sum of its new entries' deltas (order-independent, so an out-of-order batch cannot move a
balance backwards) while its version only ever rises. Before the commit every entry is claimed in
Redis, so an entry the API rolled back (publish timed out) is skipped and a late rollback cannot undo
a persisted one. After the commit the entries leave the consistency set.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from hotledger import keys
from hotledger.dal import db
from hotledger.ledger.entry import ENTRY_TABLES, stored_entries
from hotledger.outbox.events import LedgerEvent, PoisonRecord, RedPacketClaimEvent, VoucherOrderEvent


REJECTED_TOPIC = "rejected-entries"


@dataclass
class PersistReport:
    applied: int = 0
    duplicates: int = 0
    rolled_back: int = 0
    dead_lettered: int = 0
    flagged_accounts: list[int] = field(default_factory=list)

    def add(self, other: PersistReport) -> None:
        self.applied += other.applied
        self.duplicates += other.duplicates
        self.rolled_back += other.rolled_back
        self.dead_lettered += other.dead_lettered
        self.flagged_accounts += other.flagged_accounts


def rejected(key: str, event_id: int, event, why: str) -> PoisonRecord:
    """An event that decoded fine but cannot apply: keyed by its id (partition -1) in the dead letters."""
    return PoisonRecord(REJECTED_TOPIC, -1, event_id, key.encode(), event.model_dump_json().encode(), why)


def claim_groups(scripts, groups: list[list[str]], fate_ttl_s: int) -> list[list[bool]]:
    """Mark fate keys 'claimed' (one claim script per group of same-slot keys, pipelined); False where the
    API rolled the change back first."""
    if not groups:
        return []
    pipe = scripts.client.pipeline(transaction=False)
    for fate_keys in groups:
        scripts.outbox_claim(keys=fate_keys, args=[fate_ttl_s], client=pipe)
    return [[mark == 1 for mark in marks] for marks in pipe.execute()]


def dedupe_and_claim(scripts, events: list, event_id, slot_of, fate_key, fate_ttl_s: int) -> tuple[list, int, int]:
    """Drop repeated ids, then claim every event's fate key, one claim script per slot (account, voucher,
    packet). Returns (the claimed events, how many repeats, how many the API rolled back first)."""
    unique = list({event_id(e): e for e in events}.values())
    by_slot = defaultdict(list)
    for e in unique:
        by_slot[slot_of(e)].append(e)
    verdicts = claim_groups(scripts, [[fate_key(slot, e) for e in group] for slot, group in by_slot.items()], fate_ttl_s)
    claimed = [e for group, marks in zip(by_slot.values(), verdicts) for e, mark in zip(group, marks) if mark]
    return claimed, len(events) - len(unique), len(unique) - len(claimed)


def dead_letter(cur, records: list[PoisonRecord]) -> int:
    if not records:
        return 0
    cur.execute("INSERT IGNORE INTO t_dead_letter (topic, partition_no, offset_no, record_key, record_value, error) VALUES "
                + ",".join(["(%s,%s,%s,%s,%s,%s)"] * len(records)),
                [v for r in records for v in (r.topic, r.partition, r.offset, r.key, r.value, r.error[:1024])])
    return len(records)


def _entry_values(conn, e: LedgerEvent) -> str:
    # every value but the key is a validated int: formatting them directly is ~15x cheaper than the driver's
    # escaping, which matters at tens of thousands of rows per second; the key is escaped by the driver
    idem_key = "NULL" if e.idem_key is None else conn.escape(e.idem_key)
    return "(%d,%d,%d,%d,%d,'ASYNC',%s,FROM_UNIXTIME(%d/1000))" % (
        e.id, e.user_id, e.amount, e.balance_after, e.version, idem_key, e.ts)


class Writer:
    def __init__(self, scripts, fate_ttl_s: int, seckill_persister, redpacket_persister):
        self.scripts, self.redis, self.fate_ttl_s = scripts, scripts.client, fate_ttl_s
        self.seckill, self.redpackets = seckill_persister, redpacket_persister

    def persist(self, events: list, poison: list[PoisonRecord] = ()) -> PersistReport:
        report = self._persist_ledger([e for e in events if isinstance(e, LedgerEvent)], poison)
        orders = [e for e in events if isinstance(e, VoucherOrderEvent)]
        if orders:
            report.add(self.seckill.persist(orders))
        claims = [e for e in events if isinstance(e, RedPacketClaimEvent)]
        if claims:
            report.add(self.redpackets.persist(claims))
        return report

    def _persist_ledger(self, events: list[LedgerEvent], poison: list[PoisonRecord]) -> PersistReport:
        report = PersistReport()
        if not events and not poison:
            return report
        claimed, report.duplicates, report.rolled_back = dedupe_and_claim(
            self.scripts, events, lambda e: e.id, lambda e: e.user_id, lambda user_id, e: keys.fate(user_id, e.id),
            self.fate_ttl_s)
        with db.transaction() as cur:
            known = self._lock_accounts(cur, {e.user_id for e in claimed})
            orphans = [e for e in claimed if e.user_id not in known]
            fresh, clashes = self._split_by_db(cur, [e for e in claimed if e.user_id in known])
            report.duplicates += len(claimed) - len(orphans) - len(fresh) - len(clashes)
            self._insert(cur, fresh)
            self._move_accounts(cur, fresh, known)
            dead = list(poison) + [
                rejected(str(e.user_id), e.id, e, why)
                for group, why in ((orphans, "account does not exist"), (clashes, "entry id already used by another entry"))
                for e in group
            ]
            report.dead_lettered = dead_letter(cur, dead)
        report.applied = len(fresh)
        report.flagged_accounts = self._settle([e for e in claimed if e.user_id in known])
        return report

    @staticmethod
    def _lock_accounts(cur, user_ids: set[int]) -> dict[int, int]:
        """Lock the accounts in id order (no deadlock between writers); returns user_id -> version."""
        if not user_ids:
            return {}
        ordered = sorted(user_ids)
        cur.execute(
            f"SELECT user_id, version FROM t_account WHERE user_id IN ({','.join(['%s'] * len(ordered))})"
            " ORDER BY user_id FOR UPDATE",
            ordered,
        )
        return dict(cur.fetchall())

    @staticmethod
    def _split_by_db(cur, events: list[LedgerEvent]) -> tuple[list[LedgerEvent], list[LedgerEvent]]:
        """(not in the DB yet, same id in the DB with other content: an id clash, never silently dropped)."""
        present = stored_entries(cur, [(e.id, e.kind) for e in events])
        fresh = [e for e in events if e.id not in present]
        clashes = [e for e in events if e.id in present and present[e.id] != (e.user_id, e.amount, e.version)]
        return fresh, clashes

    @staticmethod
    def _insert(cur, events: list[LedgerEvent]) -> None:
        for table, amount_col, kind in ENTRY_TABLES:
            values = [_entry_values(cur.connection, e) for e in events if e.kind == kind]
            if values:
                cur.execute(f"INSERT INTO {table} (id, user_id, {amount_col}, balance, version, mode, idem_key, create_time)"
                            f" VALUES {','.join(values)}")

    @staticmethod
    def _move_accounts(cur, events: list[LedgerEvent], versions: dict[int, int]) -> None:
        delta: dict[int, int] = defaultdict(int)
        latest: dict[int, LedgerEvent] = {}
        for e in events:
            delta[e.user_id] += e.delta
            if e.user_id not in latest or e.version > latest[e.user_id].version:
                latest[e.user_id] = e
        if not delta:
            return
        cur.execute("INSERT INTO t_account (user_id, balance, version) VALUES "
                    + ",".join("(%d,%d,%d)" % (user_id, d, latest[user_id].version) for user_id, d in delta.items())
                    + " ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance), version = GREATEST(version, VALUES(version))")
        # api_open follows the newest change, and only if it is newer than what the DB has seen
        newer = [e for user_id, e in latest.items() if e.version > versions[user_id]]
        if newer:  # one statement for all accounts: CASE on the id
            cases = " ".join(["WHEN %s THEN %s"] * len(newer))
            cur.execute(
                f"UPDATE t_user SET api_open = CASE id {cases} END, close_reason = CASE id {cases} END"
                f" WHERE id IN ({','.join(['%s'] * len(newer))})",
                [x for e in newer for x in (e.user_id, 1 if e.open == "1" else 0)]
                + [x for e in newer for x in (e.user_id, None if e.open == "1" else e.open)]
                + [e.user_id for e in newer],
            )

    def _settle(self, events: list[LedgerEvent]) -> list[int]:
        """Drop persisted entries from Redis; returns accounts flagged for the reconciler."""
        by_user = defaultdict(list)
        for e in events:
            by_user[e.user_id].append(e)
        if not by_user:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for user_id, group in by_user.items():
            self.scripts.ledger_settle(
                keys=[keys.consistency(user_id), keys.balance(user_id), *(keys.entry(user_id, e.id) for e in group)],
                args=[",".join(sorted({e.epoch for e in group})), *(e.id for e in group)],
                client=pipe,
            )
        replies = pipe.execute()
        return [user_id for user_id, reply in zip(by_user, replies) if reply[1] == 1]
