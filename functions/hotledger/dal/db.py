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
    """Yield a cursor inside BEGIN ... COMMIT; roll back on any error. Connection-level failures
    surface as DatabaseUnavailable so callers can retry or fail the batch."""
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
        _drop_connection()
        raise DatabaseUnavailable(str(exc)) from exc
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
