"""The webhooks' storage: endpoints (t_webhook_endpoint) and deliveries (t_webhook_delivery), and `enqueue`, the part
of the booking transaction that writes a delivery for each subscribed endpoint."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from hotledger.dal import db
from hotledger.ledger.entry import Booked
from hotledger.webhooks.events import BALANCE_TYPES, EVENT_TYPES, alert_event_id, alert_payload, event_id, payload

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

    from hotledger.dal.budget import Budget
    from hotledger.monitors.store import Alert

PENDING, DELIVERED, DEAD = "PENDING", "DELIVERED", "DEAD"
Key = tuple[int, int, int]  # a delivery's place in an endpoint's deliveries: (user_id, seq, sub_seq)
PRUNE_BATCH = 500
FAN_OUT_BATCH = 500  # events fanned out per transaction
# old secrets signing at once at most (rotations overlapping further retire the oldest early): a delivery carries at
# most MAX_OLD_SECRETS + 1 signatures
MAX_OLD_SECRETS = 4


@dataclass(frozen=True)
class Endpoint:
    endpoint_id: int
    url: str
    event_types: tuple[str, ...]
    description: str
    secret: str
    previous: tuple[tuple[str, int], ...]  # old secrets still in their overlap: (sealed secret, signs until ms)
    enabled: bool
    failing: bool
    created_at: int
    operator_owned: bool = False  # created by an operator: only operators change it
    created_by: str = ""

    def secrets(self, now_ms: int) -> list[str]:
        """The secrets a delivery is signed with now: the current one, and each old one until its overlap ends."""
        return [self.secret] + [secret for secret, until in self.previous if until > now_ms]


@dataclass(frozen=True)
class Delivery:
    endpoint_id: int
    user_id: int
    seq: int
    prev_seq: int | None
    event_id: str
    type: str
    payload: str
    state: str
    attempts: int
    next_attempt_at: int
    last_status: int | None
    last_error: str | None
    created_at: int
    delivered_at: int | None
    retry_from: int | None = None  # its last replay: its 3 days of retries count from then (else from created_at)
    sub_seq: int = 0  # 0: the entry's own event; 1, 2, ...: its balance monitors' crossings

    @property
    def cursor(self) -> str:
        """Its place in a listing (newest first): `before` in the next page's request."""
        return f"{self.created_at}.{self.user_id}.{self.seq}.{self.sub_seq}"


_ENDPOINT = (
    "SELECT id, url, event_types, description, secret, previous_secrets, enabled, failing,"
    " created_at, operator_owned, created_by FROM t_webhook_endpoint"
)
_DELIVERY = (
    "SELECT endpoint_id, user_id, seq, prev_seq, event_id, type, payload, state, attempts, next_attempt_at,"
    " last_status, last_error, created_at, delivered_at, retry_from, sub_seq FROM t_webhook_delivery"
)


# A look at what is due (WebhookStore.due): per enabled endpoint not busy now, its due heads (t_webhook_head,
# idx_head_due: earliest first, at most its share of the look), then each head's run from its account's first PENDING
# delivery (idx_delivery_run: a range of the index, at most the share of the run), never the rows waiting behind them:
# the cost of a look is bounded by the look, whatever the backlog.
_HEADS = (
    "(SELECT endpoint_id, user_id FROM t_webhook_head WHERE endpoint_id = %s AND next_attempt_at <= %s"
    " ORDER BY next_attempt_at LIMIT %s)"
)
_RUN = f"({_DELIVERY} WHERE state = 'PENDING' AND endpoint_id = %s AND user_id = %s ORDER BY seq, sub_seq LIMIT %s)"
_UPSERT_HEAD = (
    "INSERT INTO t_webhook_head (endpoint_id, user_id, next_attempt_at) VALUES (%s, %s, %s)"
    " ON DUPLICATE KEY UPDATE next_attempt_at = LEAST(next_attempt_at, VALUES(next_attempt_at))"
)


class EndpointChange(TypedDict, total=False):
    """The columns WebhookStore.update sets (flags as 0 / 1)."""

    url: str
    event_types: list[str]
    description: str
    enabled: int
    failing: int
    deleted: int


def _endpoint(row: tuple[Any, ...]) -> Endpoint:
    id_, url, types, description, secret, previous, enabled, failing, created, by_operator, created_by = row
    return Endpoint(
        id_,
        url,
        tuple(t for t in types.split(",") if t),
        description,
        secret,
        tuple((old, until) for old, until in json.loads(previous or "[]")),
        bool(enabled),
        bool(failing),
        created,
        bool(by_operator),
        created_by,
    )


_Body = Callable[[int | None, int], tuple[str, str]]  # an event's id and body, given the previous seq and the digits


def _entry_body(r: Booked) -> _Body:
    return lambda prev, decimals: (event_id(r), payload(r, prev, decimals))


def _alert_body(a: Alert) -> _Body:
    return lambda prev, decimals: (alert_event_id(a), alert_payload(a, prev, decimals))


def _decimals(cursor: Cursor, users: list[int]) -> dict[int, int]:
    """The minor-unit digits of each account's currency (t_account.currency; NULL: DEFAULT_CURRENCY)."""
    from hotledger.config import settings
    from hotledger.money import MINOR_UNITS

    cursor.execute(
        f"SELECT user_id, currency FROM t_account WHERE user_id IN ({','.join(['%s'] * len(users))})", tuple(users)
    )
    default = settings().default_currency
    return {user_id: MINOR_UNITS.get(code or default, 2) for user_id, code in cursor.fetchall()}


_Event = tuple[int, int, int, str, int, _Body]  # (user, seq, sub_seq, type, at, its id and body given the prev seq)


SUBSCRIBED_READ = "SELECT event_types FROM t_webhook_endpoint WHERE deleted = 0"


def subscribed_of(rows: Sequence[Sequence[Any]]) -> set[str]:
    """The event types some endpoint subscribes to, from SUBSCRIBED_READ's rows."""
    return {t for (types,) in rows for t in types.split(",") if t}


def enqueue(
    cursor: Cursor, rows: list[Booked], alerts: Sequence[Alert] = (), subscribed: set[str] | None = None
) -> None:
    """In the transaction that books `rows` (and judged the balance monitors' `alerts` of them): one t_webhook_event
    row per event of a type some endpoint (enabled or not) subscribes to, whatever the number of endpoints. The sender
    fans them out to each endpoint's deliveries outside this transaction (WebhookStore.fan_out). subscribed: those
    types read (SUBSCRIBED_READ) in this transaction already; None: read here."""
    if not rows:
        return
    if subscribed is None:
        cursor.execute(SUBSCRIBED_READ)
        subscribed = subscribed_of(cursor.fetchall())
    if not subscribed:
        return
    # an entry's crossings follow its event, one sub_seq each (1, 2, ... in monitor order: stable, so a replayed batch
    # writes the same rows)
    crossings: dict[tuple[int, int], int] = defaultdict(int)
    events = [(r.user_id, r.seq, 0, EVENT_TYPES[r.type], r.booked_at, json.dumps(asdict(r))) for r in rows]
    for a in sorted(alerts, key=lambda a: (a.user_id, a.seq, a.monitor_id)):
        crossings[(a.user_id, a.seq)] += 1
        sub_seq = crossings[(a.user_id, a.seq)]
        events.append((a.user_id, a.seq, sub_seq, BALANCE_TYPES[a.direction], a.at, json.dumps(asdict(a))))
    wanted = sorted(e for e in events if e[3] in subscribed)
    if wanted:
        cursor.executemany(
            "INSERT IGNORE INTO t_webhook_event (user_id, seq, sub_seq, type, at, source)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            wanted,
        )


def _deliveries(cursor: Cursor, events: list[_Event]) -> None:
    """One PENDING delivery per event and endpoint subscribed to its type, with the previous seq of that account for
    that endpoint. A disabled endpoint's too: they wait (due skips disabled endpoints) and go out, in order, when it is
    enabled again. An endpoint gets the events booked from its creation on (as Stripe's do), never older ones whose
    fan-out happened to wait. `events`: a prefix of each of their accounts' events not fanned out yet, in key order."""
    cursor.execute("SELECT id, event_types, created_at FROM t_webhook_endpoint WHERE deleted = 0")
    endpoints = [(id_, set(types.split(",")), created_at) for id_, types, created_at in cursor.fetchall()]
    wanted = [(id_, e) for id_, types, since in endpoints for e in events if e[3] in types and e[4] >= since]
    if not wanted:
        return
    users, ids = sorted({e[0] for _, e in wanted}), sorted({id_ for id_, _ in wanted})
    cursor.execute(  # the last seq fanned out per (endpoint, account): kept apart from the rows retention prunes
        f"SELECT endpoint_id, user_id, last_seq FROM t_webhook_last WHERE endpoint_id IN"
        f" ({','.join(['%s'] * len(ids))}) AND user_id IN ({','.join(['%s'] * len(users))})",
        (*ids, *users),
    )
    last: dict[tuple[int, int], int] = {(e, u): s for e, u, s in cursor.fetchall()}
    decimals = _decimals(cursor, users)
    values = []
    for endpoint_id, (user_id, seq, sub_seq, type_, at, body) in sorted(wanted, key=lambda w: (w[0], *w[1][:3])):
        prev = last.get((endpoint_id, user_id))
        id_, text = body(prev, decimals.get(user_id, 2))
        values.append((endpoint_id, user_id, seq, sub_seq, prev, id_, type_, text, at, at))
        last[(endpoint_id, user_id)] = seq
    cursor.executemany(
        "INSERT INTO t_webhook_last (endpoint_id, user_id, last_seq) VALUES (%s, %s, %s)"
        " ON DUPLICATE KEY UPDATE last_seq = GREATEST(last_seq, VALUES(last_seq))",
        sorted({(v[0], v[1]): (v[0], v[1], last[(v[0], v[1])]) for v in values}.values()),
    )
    heads: dict[tuple[int, int], int] = {}
    for v in values:
        heads[(v[0], v[1])] = min(heads.get((v[0], v[1]), v[8]), v[8])
    # the heads first (the sender's lock order: a head, then its deliveries), in key order
    cursor.executemany(_UPSERT_HEAD, [(e, u, at) for (e, u), at in sorted(heads.items())])
    cursor.executemany(
        "INSERT IGNORE INTO t_webhook_delivery (endpoint_id, user_id, seq, sub_seq, prev_seq, event_id, type, payload,"
        " state, next_attempt_at, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'PENDING', %s, %s)",
        values,
    )


class WebhookStore:
    # endpoints ----------------------------------------------------------------------------------------------------
    def create(
        self,
        url: str,
        event_types: list[str],
        description: str,
        secret: str,
        now_ms: int,
        operator_owned: bool = False,
        created_by: str = "",
        max_endpoints: int | None = None,
    ) -> int | None:
        """The new endpoint's id, or None when max_endpoints live already (counted under a lock: two creates at once
        cannot both pass it)."""
        with db.transaction() as cur:
            if max_endpoints is not None:
                cur.execute("SELECT id FROM t_webhook_endpoint WHERE deleted = 0 FOR UPDATE")
                if len(cur.fetchall()) >= max_endpoints:
                    return None
            cur.execute(
                "INSERT INTO t_webhook_endpoint (url, event_types, description, secret, created_at, operator_owned,"
                " created_by) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (url, ",".join(event_types), description, secret, now_ms, int(operator_owned), created_by[:200]),
            )
            return int(cur.lastrowid)

    def endpoint(self, endpoint_id: int) -> Endpoint | None:
        rows = db.query(_ENDPOINT + " WHERE id = %s AND deleted = 0", (endpoint_id,))
        return _endpoint(rows[0]) if rows else None

    def endpoints(self) -> list[Endpoint]:
        return [_endpoint(row) for row in db.query(_ENDPOINT + " WHERE deleted = 0 ORDER BY id")]

    def update(self, endpoint_id: int, **fields: Unpack[EndpointChange]) -> None:
        columns = {
            "url": "url",
            "event_types": "event_types",
            "description": "description",
            "enabled": "enabled",
            "failing": "failing",
            "deleted": "deleted",
        }
        values: dict[str, object] = {**fields}
        if "event_types" in fields:
            values["event_types"] = ",".join(fields["event_types"])
        sets = [(columns[name], value) for name, value in values.items()]
        if sets:
            db.execute(
                f"UPDATE t_webhook_endpoint SET {', '.join(f'{c} = %s' for c, _ in sets)} WHERE id = %s",
                (*(v for _, v in sets), endpoint_id),
            )

    def holding_clear_secrets(self) -> list[int]:
        """Endpoints (deleted ones too) whose current or old secrets include one kept as it is ('whsec_...')."""
        rows = db.query(
            "SELECT id FROM t_webhook_endpoint WHERE secret LIKE %s OR previous_secrets LIKE %s ORDER BY id",
            ("whsec\\_%", '%"whsec\\_%'),
        )
        return [int(endpoint_id) for (endpoint_id,) in rows]

    def reseal(self, endpoint_id: int, seal: Callable[[str], str]) -> int:
        """The endpoint's secrets, current and old, each replaced by seal(it) (which keeps a sealed one as it is), under
        the row's lock (a rotation meanwhile waits). Returns how many changed."""
        with db.transaction() as cur:
            cur.execute(
                "SELECT secret, previous_secrets FROM t_webhook_endpoint WHERE id = %s FOR UPDATE", (endpoint_id,)
            )
            current, previous = cur.fetchone()
            old: list[tuple[str, int]] = [(secret, until) for secret, until in json.loads(previous or "[]")]
            now_current, now_old = seal(current), [(seal(secret), until) for secret, until in old]
            changed = int(now_current != current) + sum(
                new != was for (new, _), (was, _) in zip(now_old, old, strict=True)
            )
            cur.execute(
                "UPDATE t_webhook_endpoint SET secret = %s, previous_secrets = %s WHERE id = %s",
                (now_current, json.dumps(now_old) if now_old else None, endpoint_id),
            )
            return changed

    def rotate(self, endpoint_id: int, secret: str, now_ms: int, overlap_ends: int) -> None:
        """`secret` signs from now on; the current one, and each old one, until its own overlap ends or this one's
        does, the earlier (overlap_ends <= now_ms: every old secret retired at once, a leak's rotation)."""
        with db.transaction() as cur:
            cur.execute(
                "SELECT secret, previous_secrets FROM t_webhook_endpoint WHERE id = %s FOR UPDATE", (endpoint_id,)
            )
            current, previous = cur.fetchone()
            kept = [
                [old, min(until, overlap_ends)]
                for old, until in [[current, overlap_ends], *json.loads(previous or "[]")]
                if min(until, overlap_ends) > now_ms
            ][:MAX_OLD_SECRETS]
            cur.execute(
                "UPDATE t_webhook_endpoint SET secret = %s, previous_secrets = %s WHERE id = %s",
                (secret, json.dumps(kept) if kept else None, endpoint_id),
            )

    # deliveries ---------------------------------------------------------------------------------------------------
    def fan_out(self, limit: int = FAN_OUT_BATCH) -> int:
        """The first `limit` events the bookings wrote (t_webhook_event, key order) become each subscribed endpoint's
        deliveries, and are deleted, in one transaction of their own (never the booking's). Returns how many events:
        fewer than `limit` when none is left."""
        from hotledger.monitors.store import Alert

        with db.transaction() as cur:
            cur.execute(
                "SELECT user_id, seq, sub_seq, type, at, source FROM t_webhook_event ORDER BY user_id, seq, sub_seq"
                " LIMIT %s FOR UPDATE",
                (limit,),
            )
            found = cur.fetchall()
            if not found:
                return 0
            events: list[_Event] = [
                (
                    u,
                    q,
                    sub,
                    type_,
                    at,
                    _entry_body(Booked(**json.loads(source))) if sub == 0 else _alert_body(Alert(**json.loads(source))),
                )
                for u, q, sub, type_, at, source in found
            ]
            _deliveries(cur, events)
            cur.execute(
                "DELETE FROM t_webhook_event WHERE (user_id, seq, sub_seq) IN"
                f" ({','.join(['(%s, %s, %s)'] * len(found))})",
                [v for row in found for v in row[:3]],
            )
            return len(found)

    def due(self, now_ms: int, limit: int, busy: Collection[int] = ()) -> list[Delivery]:
        """Per enabled endpoint (but those in `busy`, being sent to now) and account, the run of PENDING deliveries
        from the account's first PENDING one up to (not including) the first one not due yet, in (seq, sub_seq)
        order; at most `limit` in all, taken round-robin over the endpoints and, within one, over its accounts' runs
        (every run's first one, then every run's second, ...): each endpoint gets a fair share of the look and each
        run returned is a prefix of its account's. Reads the due heads and their runs only (t_webhook_head): its cost
        does not grow with what waits behind them. A head found with nothing due is moved on (advance)."""
        endpoints = [
            row[0]
            for row in db.query("SELECT id FROM t_webhook_endpoint WHERE enabled = 1 AND deleted = 0 ORDER BY id")
            if row[0] not in busy
        ]
        if not endpoints or limit <= 0:
            return []
        share = -(-limit // len(endpoints))
        heads = db.query(
            " UNION ALL ".join([_HEADS] * len(endpoints)), [v for e in endpoints for v in (e, now_ms, share)]
        )
        if not heads:
            return []
        per_endpoint: dict[int, int] = defaultdict(int)
        for e, _ in heads:
            per_endpoint[e] += 1
        wanted = [(e, u, max(1, -(-share // per_endpoint[e]))) for e, u in heads]
        rows = db.query(" UNION ALL ".join([_RUN] * len(wanted)), [v for key in wanted for v in key])
        found: dict[tuple[int, int], list[Delivery]] = defaultdict(list)
        for row in rows:
            d = Delivery(*row)
            found[(d.endpoint_id, d.user_id)].append(d)
        ranked: list[tuple[int, int, Delivery]] = []
        for e, u, _ in wanted:
            run = found.get((e, u), [])
            cut = next((i for i, d in enumerate(run) if d.next_attempt_at > now_ms), len(run))
            if cut == 0:
                self.advance(e, u)  # the head was early (a retry moved its first one on): set it right
            ranked.extend((n, e, d) for n, d in enumerate(run[:cut]))
        # every endpoint's k-th before any endpoint's (k+1)-th; within an endpoint, every run's n-th before its (n+1)-th
        per_endpoint_k: dict[int, int] = defaultdict(int)
        ordered: list[tuple[int, int, int, Delivery]] = []
        for n, e, d in sorted(ranked, key=lambda r: (r[1], r[0])):
            per_endpoint_k[e] += 1
            ordered.append((per_endpoint_k[e], e, n, d))
        return [d for _, _, _, d in sorted(ordered, key=lambda r: (r[0], r[1]))[:limit]]

    def advance(self, endpoint_id: int, user_id: int) -> None:
        """The head of (endpoint, account) set to its first PENDING delivery's next attempt, or dropped when it has
        none. The head is locked first (as enqueue and replays take it), then the deliveries read as committed: a
        delivery written meanwhile either waits for this lock or is seen."""
        with db.transaction() as cur:
            cur.execute(
                "SELECT next_attempt_at FROM t_webhook_head WHERE endpoint_id = %s AND user_id = %s FOR UPDATE",
                (endpoint_id, user_id),
            )
            if not cur.fetchall():
                return
            cur.execute(
                "SELECT next_attempt_at FROM t_webhook_delivery WHERE state = 'PENDING' AND endpoint_id = %s"
                " AND user_id = %s ORDER BY seq, sub_seq LIMIT 1 LOCK IN SHARE MODE",
                (endpoint_id, user_id),
            )
            first = cur.fetchall()
            if first:
                cur.execute(
                    "UPDATE t_webhook_head SET next_attempt_at = %s WHERE endpoint_id = %s AND user_id = %s",
                    (first[0][0], endpoint_id, user_id),
                )
            else:
                cur.execute(
                    "DELETE FROM t_webhook_head WHERE endpoint_id = %s AND user_id = %s", (endpoint_id, user_id)
                )

    def delivered(self, d: Delivery, status: int, now_ms: int) -> None:
        db.execute(
            "UPDATE t_webhook_delivery SET state = 'DELIVERED', attempts = attempts + 1, last_status = %s,"
            " last_error = NULL, delivered_at = %s, next_attempt_at = %s WHERE endpoint_id = %s AND user_id = %s"
            " AND seq = %s AND event_id = %s",
            (status, now_ms, now_ms, d.endpoint_id, d.user_id, d.seq, d.event_id),
        )

    def failed(self, d: Delivery, status: int | None, error: str, next_attempt_at: int | None) -> None:
        """Another attempt at next_attempt_at, or (None) dead-lettered and the endpoint flagged failing."""
        with db.transaction() as cur:
            cur.execute(
                "UPDATE t_webhook_delivery SET attempts = attempts + 1, last_status = %s, last_error = %s,"
                " state = %s, next_attempt_at = %s WHERE endpoint_id = %s AND user_id = %s AND seq = %s"
                " AND event_id = %s",
                (
                    status,
                    error[:500],
                    PENDING if next_attempt_at else DEAD,
                    next_attempt_at or d.next_attempt_at,
                    d.endpoint_id,
                    d.user_id,
                    d.seq,
                    d.event_id,
                ),
            )
            if next_attempt_at is None:
                cur.execute("UPDATE t_webhook_endpoint SET failing = 1 WHERE id = %s", (d.endpoint_id,))

    def gone(self, d: Delivery, error: str, now_ms: int) -> None:
        """The endpoint answered 410 Gone: the attempt counted, the delivery PENDING as it was (it goes out, first of
        its account, once the endpoint is enabled again) and the endpoint disabled."""
        with db.transaction() as cur:
            cur.execute(
                "UPDATE t_webhook_delivery SET attempts = attempts + 1, last_status = 410, last_error = %s"
                " WHERE endpoint_id = %s AND user_id = %s AND seq = %s AND event_id = %s",
                (error[:500], d.endpoint_id, d.user_id, d.seq, d.event_id),
            )
            cur.execute("UPDATE t_webhook_endpoint SET enabled = 0 WHERE id = %s", (d.endpoint_id,))
            cur.execute(  # a change of the endpoint, in the operators' log like the others (ops/store.py's shape)
                "INSERT INTO t_ops_log (actor, action, detail, created_at) VALUES (%s, %s, %s, %s)",
                (
                    "webhook-sender",
                    "disable.webhook-endpoint",
                    json.dumps({"endpoint_id": str(d.endpoint_id), "enabled": False, "reason": "HTTP 410 Gone"}),
                    now_ms,
                ),
            )

    def deliveries(
        self, endpoint_id: int, state: str | None, limit: int, before: tuple[int, int, int, int] | None = None
    ) -> list[Delivery]:
        """A page of the endpoint's deliveries (of one state), newest first: (created_at, user_id, seq, sub_seq)
        descending, after `before` (the previous page's last one's cursor). The order is an index's
        (idx_delivery_state_created, or idx_delivery_endpoint_created without a state; the key completes both): a
        page reads about its own rows, never the endpoint's whole history sorted."""
        where = "WHERE endpoint_id = %s"
        args: list[int | str] = [endpoint_id]
        if state:
            where += " AND state = %s"
            args.append(state)
        if before is not None:
            c, u, q, sub = before
            where += (
                " AND (created_at < %s OR (created_at = %s AND (user_id < %s OR (user_id = %s AND (seq < %s"
                " OR (seq = %s AND sub_seq < %s))))))"
            )
            args += [c, c, u, u, q, q, sub]
        return [
            Delivery(*row)
            for row in db.query(
                f"{_DELIVERY} {where} ORDER BY created_at DESC, user_id DESC, seq DESC, sub_seq DESC LIMIT %s",
                (*args, limit),
            )
        ]

    def replay(
        self,
        endpoint_id: int,
        now_ms: int,
        since_seq: int | None,
        since_ms: int | None,
        user_id: int | None,
        after: Key | None,
        limit: int,
    ) -> tuple[int, Key | None]:
        """One page of a replay: the endpoint's next `limit` deliveries in key order (account, seq, sub_seq) after
        `after` (or from the start: user_id's account from since_seq, or every account), of which those booked since
        since_ms become PENDING again, due now, their 3 days of retries counted from now. Returns how many, and the key
        the next page starts after (None: none left). It reads and changes at most `limit` rows, by their keys."""
        where, args = ["endpoint_id = %s"], [endpoint_id]
        if user_id is not None:
            where.append("user_id = %s")
            args.append(user_id)
        if after is not None:
            where.append("(user_id > %s OR (user_id = %s AND (seq > %s OR (seq = %s AND sub_seq > %s))))")
            args += [after[0], after[0], after[1], after[1], after[2]]
        elif since_seq is not None:
            where.append("seq >= %s")
            args.append(since_seq)
        page = db.query(
            f"SELECT user_id, seq, sub_seq, created_at FROM t_webhook_delivery WHERE {' AND '.join(where)}"
            " ORDER BY user_id, seq, sub_seq LIMIT %s",
            (*args, limit),
        )
        wanted = [(u, q, sub) for u, q, sub, created in page if since_ms is None or created >= since_ms]
        replayed = 0
        if wanted:
            with db.transaction() as cur:  # the heads first (the sender's lock order), due now
                cur.executemany(_UPSERT_HEAD, [(endpoint_id, u, now_ms) for u in sorted({u for u, _, _ in wanted})])
                replayed = cur.execute(
                    "UPDATE t_webhook_delivery SET state = 'PENDING', attempts = 0, next_attempt_at = %s,"
                    f" retry_from = %s WHERE endpoint_id = %s AND (user_id, seq, sub_seq) IN"
                    f" ({','.join(['(%s, %s, %s)'] * len(wanted))})",
                    (now_ms, now_ms, endpoint_id, *(v for key in wanted for v in key)),
                )
        last = page[-1] if len(page) == limit else None
        return replayed, (int(last[0]), int(last[1]), int(last[2])) if last else None

    def dead(self, limit: int) -> list[Delivery]:
        """Every endpoint's dead-lettered deliveries, newest first."""
        return [
            Delivery(*row)
            for row in db.query(
                f"{_DELIVERY} WHERE state = 'DEAD' ORDER BY created_at DESC, seq DESC LIMIT %s", (limit,)
            )
        ]

    def revive_dead(self, endpoint_id: int | None, now_ms: int) -> int:
        """The dead-lettered deliveries (of one endpoint, or of every endpoint not deleted) PENDING again, due now,
        their 3 days of retries from now, their endpoints no longer flagged failing; returns how many. A second call
        finds none: a replay is done once. A deleted endpoint's are never revived (they wait for their pruning)."""
        where, args = "d.state = 'DEAD' AND e.deleted = 0", tuple[int, ...]()
        if endpoint_id is not None:
            where, args = where + " AND d.endpoint_id = %s", (endpoint_id,)
        with db.transaction() as cur:
            cur.execute(
                "SELECT DISTINCT d.endpoint_id, d.user_id FROM t_webhook_delivery d JOIN t_webhook_endpoint e"
                f" ON e.id = d.endpoint_id WHERE {where}",
                args,
            )
            pairs = sorted((int(e), int(u)) for e, u in cur.fetchall())
            if not pairs:
                return 0
            # the heads first (the sender's lock order); then the dead ones of exactly those heads
            cur.executemany(_UPSERT_HEAD, [(e, u, now_ms) for e, u in pairs])
            revived = cur.execute(
                "UPDATE t_webhook_delivery SET state = 'PENDING', attempts = 0, next_attempt_at = %s, retry_from = %s"
                f" WHERE state = 'DEAD' AND (endpoint_id, user_id) IN ({','.join(['(%s, %s)'] * len(pairs))})",
                (now_ms, now_ms, *(v for pair in pairs for v in pair)),
            )
            endpoints = sorted({e for e, _ in pairs})
            cur.execute(
                "UPDATE t_webhook_endpoint SET failing = 0 WHERE id IN (" + ",".join(["%s"] * len(endpoints)) + ")",
                endpoints,
            )
            return int(revived)

    # retention ----------------------------------------------------------------------------------------------------
    def prune(self, older_than_ms: int, budget: Budget) -> int:
        """Deletes, a bounded batch at a time within the budget: DELIVERED and DEAD deliveries whose last attempt was
        before older_than_ms, balance monitor crossings posted to the inbox before it, and every delivery and head of
        a deleted endpoint. Returns how many rows."""
        deleted = 0

        def batches(sql: str, args: tuple[Any, ...]) -> None:
            nonlocal deleted
            while not budget.exhausted:
                batch = max(1, budget.page(PRUNE_BATCH))
                gone = db.execute(f"{sql} LIMIT {batch}", args)
                budget.spend(max(gone, 1))
                deleted += gone
                if gone < batch:
                    return

        for state in (DELIVERED, DEAD):
            batches(
                "DELETE FROM t_webhook_delivery WHERE state = %s AND next_attempt_at < %s ORDER BY next_attempt_at",
                (state, older_than_ms),
            )
        batches("DELETE FROM t_monitor_alert WHERE inbox_posted = 1 AND at < %s ORDER BY at", (older_than_ms,))
        for (endpoint_id,) in db.query("SELECT id FROM t_webhook_endpoint WHERE deleted = 1"):
            batches("DELETE FROM t_webhook_head WHERE endpoint_id = %s", (endpoint_id,))
            batches("DELETE FROM t_webhook_last WHERE endpoint_id = %s", (endpoint_id,))
            batches("DELETE FROM t_webhook_delivery WHERE endpoint_id = %s", (endpoint_id,))
        return deleted


def by_endpoint(deliveries: list[Delivery]) -> dict[int, list[Delivery]]:
    """Grouped by endpoint, in the order given (WebhookStore.due's: each account's run in its order)."""
    grouped: dict[int, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        grouped[d.endpoint_id].append(d)
    return grouped


def runs(deliveries: list[Delivery]) -> list[list[Delivery]]:
    """One endpoint's deliveries split into its accounts' runs, each in the order given."""
    grouped: dict[int, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        grouped[d.user_id].append(d)
    return list(grouped.values())
