"""MySQL/MariaDB access with PyMySQL: one connection per process (a Lambda container runs one
invocation at a time), reconnected when it went away, and a transaction context manager.

DB_TLS=verify: TLS with the server's certificate chain and host name checked against DB_CA_BUNDLE. Credentials
from DB_SECRET_ARN are cached (SECRETS_MAX_AGE_S); when the DB refuses them (1045, the secret was rotated since),
the secret is read again once, bypassing the cache, and the connection tried with what it holds now."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pymysql
from pymysql.constants import CLIENT
from pymysql.cursors import Cursor as Cursor  # a transaction's; re-exported: only dal/ and stores import the driver

from hotledger.config import Settings, db_credentials, secret_value, settings, with_values

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
        isinstance(exc, pymysql.err.OperationalError) and exc.args and exc.args[0] in _REFUSALS_OF_DATA
    ):
        return f"the DB refused the record: ({exc.args[0]}) {exc.args[1] if len(exc.args) > 1 else ''}".strip()
    return None


ACCESS_DENIED = 1045


def tls_args(cfg: Settings) -> dict[str, str | bool]:
    """PyMySQL's TLS arguments: with DB_TLS=verify the chain and the host name are checked (PyMySQL >= 1.1)."""
    if cfg.db_tls != "verify":
        return {}
    if cfg.db_ca_bundle == "certifi":
        import certifi

        ca = certifi.where()
    else:
        ca = cfg.db_ca_bundle
    return {"ssl_ca": ca, "ssl_verify_cert": True, "ssl_verify_identity": True}


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
        client_flag=CLIENT.MULTI_STATEMENTS,  # batched_transaction: statements sent together, one round trip
        **tls_args(cfg),
    )


def connect_rotating(cfg: Settings) -> tuple[pymysql.connections.Connection, Settings]:
    """connect(cfg); refused for its credentials (1045) with a DB secret configured: read the secret again, past the
    cache, and connect once more. Returns the connection and the settings it was made with."""
    try:
        return connect(cfg), cfg
    except pymysql.err.OperationalError as exc:
        if not (cfg.db_secret_arn and exc.args and exc.args[0] == ACCESS_DENIED):
            raise
    fresh = with_values(
        cfg, **db_credentials(secret_value(cfg.db_secret_arn, cfg.secrets_max_age_s, fresh=True), os.environ)
    )
    return connect(fresh), fresh


def connection(checked: bool = True) -> pymysql.connections.Connection:
    """The process's connection, checked with a ping (unless not `checked`: the caller finds out on its first
    statement) and replaced when the server went away."""
    conn = getattr(_local, "conn", None)
    if conn is not None:
        if not checked:
            return conn
        try:
            conn.ping(reconnect=False)
            return conn
        except pymysql.err.Error:
            _drop_connection()
    cfg = settings()
    source, rotated = getattr(_local, "rotated", (None, None))
    try:
        conn, used = connect_rotating(rotated if source is cfg and rotated is not None else cfg)
    except pymysql.err.OperationalError as exc:
        raise DatabaseUnavailable(str(exc)) from exc
    _local.conn = conn
    _local.rotated = (cfg, used)  # the credentials that worked, for the next reconnect of this process
    return conn


def _drop_connection() -> None:
    conn = getattr(_local, "conn", None)
    _local.conn = None
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()


@contextlib.contextmanager
def transaction() -> Iterator[Cursor]:
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


# a statement's parameters: positional (%s) or named (%(name)s)
SqlArgs = Sequence[object] | Mapping[str, object] | None


class Batch(Cursor):  # type: ignore[misc]  # PyMySQL ships no types: its Cursor is Any
    """The cursor of a batched_transaction's writes: each statement is rendered with its values and kept, to be
    sent with COMMIT in one round trip. It reads nothing: a read through it is a fault of the caller."""

    def __init__(self, connection: pymysql.connections.Connection) -> None:
        super().__init__(connection)
        self.statements: list[str] = []

    def execute(self, query: str, args: SqlArgs = None) -> int:
        self.statements.append(self.mogrify(query, args))
        return 0

    def executemany(self, query: str, args: Sequence[SqlArgs]) -> int:
        for row in args:
            self.execute(query, row)
        return 0

    def fetchone(self) -> tuple[Any, ...] | None:
        raise TypeError("a Batch holds writes only: read in the transaction's first round trip")

    def fetchall(self) -> tuple[tuple[Any, ...], ...]:
        raise TypeError("a Batch holds writes only: read in the transaction's first round trip")


def _server_said(exc: pymysql.err.Error) -> bool:
    """Whether the server answered with this error (its codes are 1000-1999 or from 3000), rather than the client
    losing the connection (2000-2999, or PyMySQL's own 0 for a closed one): then the statements after the failed one
    did not run."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
    return 1000 <= code < 2000 or code >= 3000


def _results(cur: Cursor) -> list[list[tuple[Any, ...]]]:
    """Every result set of a multi-statement after the first (START TRANSACTION's), rows each."""
    found = []
    while cur.nextset():
        found.append(list(cur.fetchall()))
    return found


@contextlib.contextmanager
def batched_transaction(reads: Sequence[tuple[str, SqlArgs]]) -> Iterator[tuple[list[list[tuple[Any, ...]]], Batch]]:
    """A transaction of two round trips (a SYNC charge's): START TRANSACTION with the reads (a row lock the first
    of them takes), then the writes the caller put in the Batch with COMMIT. So the row lock is held for one client
    round trip and the caller's decision between. Yields (each read's rows, the Batch). An error in the body rolls
    back; a COMMIT whose answer was lost with the connection raises CommitOutcomeUnknown, a statement the server
    refused rolls back (the statements after it, COMMIT among them, did not run) and is raised as PyMySQL raised it,
    or as DatabaseUnavailable when it is transient (a deadlock, a lock wait timeout)."""
    # the connection is not pinged first (a round trip): one that went away since its last use fails the reads,
    # whose session, and the transaction they began, the server ended with it; so they are sent again, once, on a
    # new connection
    for checked in (False, True):
        try:
            conn = connection(checked)
            with conn.cursor() as cur:
                cur.execute(";".join(["START TRANSACTION", *(cur.mogrify(sql, args) for sql, args in reads)]))
                rows = _results(cur)
            break
        except pymysql.err.Error as exc:
            _drop_connection()  # a multi-statement cut short leaves the session's state unknown: a fresh one next
            if checked or _server_said(exc):
                raise DatabaseUnavailable(str(exc)) from exc
    batch = Batch(conn)
    try:
        yield rows, batch
    except BaseException:
        with contextlib.suppress(pymysql.err.Error):
            conn.rollback()
        raise
    try:
        with conn.cursor() as cur:
            cur.execute(";".join([*batch.statements, "COMMIT"]))
            _results(cur)
    except pymysql.err.Error as exc:
        if not _server_said(exc):
            _drop_connection()
            raise CommitOutcomeUnknown(str(exc)) from exc
        with contextlib.suppress(pymysql.err.Error):
            conn.rollback()
        if refused(exc) is None and isinstance(exc, pymysql.err.OperationalError):
            raise DatabaseUnavailable(str(exc)) from exc
        raise


def query(sql: str, args: SqlArgs = None) -> list[tuple[Any, ...]]:
    """Autocommit read: the rows, as PyMySQL answers them (a tuple of the columns' values each)."""
    try:
        conn = connection()
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    except pymysql.err.OperationalError as exc:
        _drop_connection()
        raise DatabaseUnavailable(str(exc)) from exc


def execute(sql: str, args: SqlArgs = None) -> int:
    """One statement in its own transaction; returns the affected row count."""
    with transaction() as cur:
        return int(cur.execute(sql, args))


def to_datetime(ms: int) -> datetime:
    """Epoch milliseconds -> the naive UTC DATETIME the sessions use."""
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)


def to_ms(moment: datetime) -> int:
    return int(moment.replace(tzinfo=UTC).timestamp() * 1000)
