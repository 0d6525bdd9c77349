"""MySQL/MariaDB access with PyMySQL: one connection per process (a Lambda container runs one
invocation at a time), reconnected when it went away, and a transaction context manager."""
from __future__ import annotations

import contextlib
import threading
from datetime import datetime, timezone

import pymysql

from hotledger.config import Settings, settings

_local = threading.local()


class DatabaseUnavailable(Exception):
    """The DB could not be reached or the transaction failed for a transient reason."""


class CommitOutcomeUnknown(DatabaseUnavailable):
    """COMMIT was sent and its answer lost: the transaction may or may not have committed."""


# Server errors PyMySQL raises as OperationalError that are refusals of the data, not failures of the server:
# a value out of range in an expression (1690), a wrong value (1292), a CHECK constraint (MariaDB 4025, MySQL 3819).
_REFUSALS_OF_DATA = frozenset({1292, 1690, 3819, 4025})


def refused(exc: BaseException) -> str | None:
    """The DB's reason when it refused a statement for the values it carries: a unique key (uk_packet_user), a
    NOT NULL, a CHECK, a value out of a column's or an expression's range. The same statement fails the same way
    on every retry, so the record that carries it must be set aside (dead-lettered), not retried.

    None for everything else, which retrying can mend: a transient failure (DatabaseUnavailable: connection lost,
    lock wait timeout 1205, deadlock 1213, server gone) or a fault in the code (ProgrammingError, ...), which a
    deploy fixes; neither may set a record aside."""
    if isinstance(exc, (pymysql.err.IntegrityError, pymysql.err.DataError)) or (
            isinstance(exc, pymysql.err.OperationalError) and exc.args and exc.args[0] in _REFUSALS_OF_DATA):
        return f"the DB refused the record: ({exc.args[0]}) {exc.args[1] if len(exc.args) > 1 else ''}".strip()
    return None


def connect(cfg: Settings) -> pymysql.connections.Connection:
    return pymysql.connect(
        host=cfg.db_host,
        port=cfg.db_port,
        user=cfg.db_user,
        password=cfg.db_password,
        database=cfg.db_name,
        autocommit=True,
        connect_timeout=3,
        read_timeout=10,
        write_timeout=10,
        charset="utf8mb4",
        init_command="SET time_zone = '+00:00'",  # every DATETIME is UTC, the defaults included
    )


def connection() -> pymysql.connections.Connection:
    """The process's connection, checked with a ping and replaced when the server went away."""
    conn = getattr(_local, "conn", None)
    if conn is not None:
        try:
            conn.ping(reconnect=False)
            return conn
        except pymysql.err.Error:
            _drop_connection()
    try:
        conn = connect(settings())
    except pymysql.err.OperationalError as exc:
        raise DatabaseUnavailable(str(exc)) from exc
    _local.conn = conn
    return conn


def _drop_connection() -> None:
    conn = getattr(_local, "conn", None)
    _local.conn = None
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()


@contextlib.contextmanager
def transaction():
    """Yield a cursor inside BEGIN ... COMMIT; roll back on any error. Connection-level (transient) failures
    surface as DatabaseUnavailable so callers can retry or fail the batch; a refusal of the data (see refused())
    is raised as PyMySQL raised it, after the rollback."""
    try:
        conn = connection()
        conn.begin()
    except pymysql.err.Error as exc:
        _drop_connection()
        raise DatabaseUnavailable(str(exc)) from exc
    try:
        with conn.cursor() as cur:
            yield cur
    except pymysql.err.OperationalError as exc:
        if refused(exc) is None:
            _drop_connection()
            raise DatabaseUnavailable(str(exc)) from exc
        with contextlib.suppress(pymysql.err.Error):
            conn.rollback()
        raise
    except BaseException:
        with contextlib.suppress(pymysql.err.Error):
            conn.rollback()
        raise
    try:
        conn.commit()
    except pymysql.err.Error as exc:
        _drop_connection()
        raise CommitOutcomeUnknown(str(exc)) from exc


def query(sql: str, args=None) -> list[tuple]:
    """Autocommit read."""
    try:
        conn = connection()
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    except pymysql.err.OperationalError as exc:
        _drop_connection()
        raise DatabaseUnavailable(str(exc)) from exc


def execute(sql: str, args=None) -> int:
    """One statement in its own transaction; returns the affected row count."""
    with transaction() as cur:
        return cur.execute(sql, args)


def to_datetime(ms: int) -> datetime:
    """Epoch milliseconds -> the naive UTC DATETIME the sessions use."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).replace(tzinfo=None)


def to_ms(moment: datetime) -> int:
    return int(moment.replace(tzinfo=timezone.utc).timestamp() * 1000)
