"""Schema migrations: every *.sql file of a folder (infra/migrations locally, the migrations layer in AWS) applied in
name order, once each (recorded in schema_migrations). Idempotent: a second run applies nothing."""

from __future__ import annotations

from pathlib import Path

from pymysql.connections import Connection


def _statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [stmt.strip() for stmt in "\n".join(lines).split(";") if stmt.strip()]


def migrate(conn: Connection, database: str, migrations: Path) -> list[str]:
    """Apply what is new over `conn` (autocommit, no database selected); returns the files applied now."""
    applied_now: list[str] = []
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{database}` CHARACTER SET utf8mb4")
        cur.execute(f"USE `{database}`")
        cur.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " name VARCHAR(255) NOT NULL PRIMARY KEY,"
            " applied_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3))"
        )
        cur.execute("SELECT name FROM schema_migrations")
        done = {row[0] for row in cur.fetchall()}
        for path in sorted(Path(migrations).glob("*.sql")):
            if path.name in done:
                continue
            for stmt in _statements(path.read_text()):
                cur.execute(stmt)
            cur.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (path.name,))
            applied_now.append(path.name)
    return applied_now
