"""The webhooks' storage: endpoints (t_webhook_endpoint) and deliveries (t_webhook_delivery), and `enqueue`, the part
of the booking transaction that writes a delivery for each subscribed endpoint."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from hotledger.dal import db
from hotledger.ledger.entry import Booked
from hotledger.webhooks.events import BALANCE_TYPES, EVENT_TYPES, alert_event_id, alert_payload, event_id, payload

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

    from hotledger.monitors.store import Alert

PENDING, DELIVERED, DEAD = "PENDING", "DELIVERED", "DEAD"


@dataclass(frozen=True)
class Endpoint:
    endpoint_id: int
    url: str
    event_types: tuple[str, ...]
    description: str
    secret: str
    previous_secret: str | None
    previous_until: int | None
    enabled: bool
    failing: bool
    created_at: int
    operator_owned: bool = False  # created by an operator: only operators change it
    created_by: str = ""

    def secrets(self, now_ms: int) -> list[str]:
        """The secrets a delivery is signed with now: the current one, and the previous one during its overlap."""
        return [self.secret] + (
            [self.previous_secret] if self.previous_secret and (self.previous_until or 0) > now_ms else []
        )


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


_ENDPOINT = (
    "SELECT id, url, event_types, description, secret, previous_secret, previous_until, enabled, failing,"
    " created_at, operator_owned, created_by FROM t_webhook_endpoint"
)
_DELIVERY = (
    "SELECT endpoint_id, user_id, seq, prev_seq, event_id, type, payload, state, attempts, next_attempt_at,"
    " last_status, last_error, created_at, delivered_at FROM t_webhook_delivery"
)


# One pass over the PENDING rows of enabled endpoints not busy now (idx_delivery_run: the index alone, no payload read),
# numbered per (endpoint, account) in (seq, sub_seq) order (n), with a running count of those not due yet: a row is in
# its account's run while that count is 0. Those rows are ranked per endpoint (k: every account's first, then every
# account's second, ...), and a look takes the k-th row of every endpoint before any endpoint's (k+1)-th: each
# endpoint's share of the `limit` is fair by construction (an endpoint with 200+ due accounts takes 1/E of a look with
# E endpoints due, not all of it), and each run taken is a prefix of its account's. Then the payloads of those rows.
_RUNS = (
    "SELECT d.endpoint_id, d.user_id, d.seq, d.prev_seq, d.event_id, d.type, d.payload, d.state, d.attempts,"
    " d.next_attempt_at, d.last_status, d.last_error, d.created_at, d.delivered_at FROM ("
    "SELECT r.endpoint_id, r.user_id, r.seq, r.sub_seq,"
    " ROW_NUMBER() OVER (PARTITION BY r.endpoint_id ORDER BY r.n, r.next_attempt_at, r.user_id) AS k FROM ("
    "SELECT p.endpoint_id, p.user_id, p.seq, p.sub_seq, p.next_attempt_at,"
    " ROW_NUMBER() OVER (PARTITION BY p.endpoint_id, p.user_id ORDER BY p.seq, p.sub_seq) AS n,"
    " SUM(p.next_attempt_at > %s) OVER (PARTITION BY p.endpoint_id, p.user_id ORDER BY p.seq, p.sub_seq"
    " ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS waiting"
    " FROM t_webhook_delivery p JOIN t_webhook_endpoint e ON e.id = p.endpoint_id AND e.enabled = 1 AND e.deleted = 0"
    " WHERE p.state = 'PENDING'{busy}) r"
    " WHERE r.waiting = 0 AND r.n <= %s) f"
    " JOIN t_webhook_delivery d ON d.endpoint_id = f.endpoint_id AND d.user_id = f.user_id AND d.seq = f.seq"
    " AND d.sub_seq = f.sub_seq"
    " WHERE f.k <= %s ORDER BY f.k, f.endpoint_id LIMIT %s"
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
    id_, url, types, description, secret, previous, until, enabled, failing, created, by_operator, created_by = row
    return Endpoint(
        id_,
        url,
        tuple(t for t in types.split(",") if t),
        description,
        secret,
        previous,
        until,
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


def enqueue(cursor: Cursor, rows: list[Booked], alerts: Sequence[Alert] = ()) -> None:
    """In the transaction that books `rows` (and judged the balance monitors' `alerts` of them): one PENDING delivery
    per event and endpoint subscribed to its type, with the previous seq of that account for that endpoint. A disabled
    endpoint's too: they wait (due skips disabled endpoints) and go out, in order, when it is enabled again."""
    if not rows:
        return
    cursor.execute("SELECT id, event_types FROM t_webhook_endpoint WHERE deleted = 0")
    endpoints = [(id_, set(types.split(","))) for id_, types in cursor.fetchall()]
    # (user, seq, sub_seq, type, at, its id and body given the previous seq): an entry's crossings follow its event,
    # one sub_seq each (1, 2, ... in monitor order: stable, so a replayed batch writes the same rows)
    crossings: dict[tuple[int, int], int] = defaultdict(int)
    events = [(r.user_id, r.seq, 0, EVENT_TYPES[r.type], r.booked_at, _entry_body(r)) for r in rows]
    for a in sorted(alerts, key=lambda a: (a.user_id, a.seq, a.monitor_id)):
        crossings[(a.user_id, a.seq)] += 1
        sub_seq = crossings[(a.user_id, a.seq)]
        events.append((a.user_id, a.seq, sub_seq, BALANCE_TYPES[a.direction], a.at, _alert_body(a)))
    wanted = [(id_, e) for id_, types in endpoints for e in events if e[3] in types]
    if not wanted:
        return
    users, ids = sorted({e[0] for _, e in wanted}), sorted({id_ for id_, _ in wanted})
    cursor.execute(
        f"SELECT endpoint_id, user_id, MAX(seq) FROM t_webhook_delivery WHERE endpoint_id IN"
        f" ({','.join(['%s'] * len(ids))}) AND user_id IN ({','.join(['%s'] * len(users))})"
        " GROUP BY endpoint_id, user_id",
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
    ) -> int:
        with db.transaction() as cur:
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

    def rotate(self, endpoint_id: int, secret: str, previous_until: int) -> None:
        db.execute(
            "UPDATE t_webhook_endpoint SET previous_secret = secret, previous_until = %s, secret = %s WHERE id = %s",
            (previous_until, secret, endpoint_id),
        )

    # deliveries ---------------------------------------------------------------------------------------------------
    def due(self, now_ms: int, limit: int, busy: Collection[int] = ()) -> list[Delivery]:
        """Per enabled endpoint (but those in `busy`, being sent to now) and account, the run of PENDING deliveries
        from the account's first PENDING one up to (not including) the first one not due yet, in (seq, sub_seq)
        order; at most `limit` in all, taken round-robin over the endpoints and, within one, over its accounts' runs
        (every run's first one, then every run's second, ...): each endpoint gets a fair share of the look and each
        run returned is a prefix of its account's."""
        skip = sorted(busy)
        sql = _RUNS.format(busy=f" AND p.endpoint_id NOT IN ({','.join(['%s'] * len(skip))})" if skip else "")
        return [Delivery(*row) for row in db.query(sql, (now_ms, *skip, limit, limit, limit))]

    def delivered(self, d: Delivery, status: int, now_ms: int) -> None:
        db.execute(
            "UPDATE t_webhook_delivery SET state = 'DELIVERED', attempts = attempts + 1, last_status = %s,"
            " last_error = NULL, delivered_at = %s WHERE endpoint_id = %s AND user_id = %s AND seq = %s AND event_id = %s",
            (status, now_ms, d.endpoint_id, d.user_id, d.seq, d.event_id),
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

    def deliveries(self, endpoint_id: int, state: str | None, limit: int) -> list[Delivery]:
        where = "WHERE endpoint_id = %s"
        args: list[int | str] = [endpoint_id]
        if state:
            where += " AND state = %s"
            args.append(state)
        return [
            Delivery(*row)
            for row in db.query(f"{_DELIVERY} {where} ORDER BY created_at DESC, seq DESC LIMIT %s", (*args, limit))
        ]

    def replay(
        self, endpoint_id: int, now_ms: int, since_seq: int | None, since_ms: int | None, user_id: int | None
    ) -> int:
        """Deliveries of the endpoint from since_seq (of user_id's account, or every account's) or booked since since_ms
        become PENDING again, due now, in their order; returns how many."""
        where, args = "endpoint_id = %s", [endpoint_id]
        if since_seq is not None:
            where += " AND seq >= %s"
            args.append(since_seq)
        if since_ms is not None:
            where += " AND created_at >= %s"
            args.append(since_ms)
        if user_id is not None:
            where += " AND user_id = %s"
            args.append(user_id)
        return db.execute(
            f"UPDATE t_webhook_delivery SET state = 'PENDING', attempts = 0, next_attempt_at = %s WHERE {where}",
            (now_ms, *args),
        )

    def dead(self, limit: int) -> list[Delivery]:
        """Every endpoint's dead-lettered deliveries, newest first."""
        return [
            Delivery(*row)
            for row in db.query(
                f"{_DELIVERY} WHERE state = 'DEAD' ORDER BY created_at DESC, seq DESC LIMIT %s", (limit,)
            )
        ]

    def revive_dead(self, endpoint_id: int | None, now_ms: int) -> int:
        """The dead-lettered deliveries (of one endpoint, or of every one) PENDING again, due now, their endpoints no
        longer flagged failing; returns how many. A second call finds none: a replay is done once."""
        where, args = (
            ("state = 'DEAD'", ()) if endpoint_id is None else ("state = 'DEAD' AND endpoint_id = %s", (endpoint_id,))
        )
        with db.transaction() as cur:
            cur.execute(f"SELECT DISTINCT endpoint_id FROM t_webhook_delivery WHERE {where} FOR UPDATE", args)
            endpoints = [row[0] for row in cur.fetchall()]
            revived = cur.execute(
                f"UPDATE t_webhook_delivery SET state = 'PENDING', attempts = 0, next_attempt_at = %s WHERE {where}",
                (now_ms, *args),
            )
            if endpoints:
                cur.execute(
                    "UPDATE t_webhook_endpoint SET failing = 0 WHERE id IN (" + ",".join(["%s"] * len(endpoints)) + ")",
                    endpoints,
                )
            return int(revived)


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
