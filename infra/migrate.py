"""Apply infra/migrations/*.sql in order, once each (recorded in schema_migrations). Idempotent.

Usage: python infra/migrate.py   (connection from DB_HOST, DB_PORT, DB_USER, DB_PASSWORD, DB_NAME)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pymysql

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def _statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [stmt.strip() for stmt in "\n".join(lines).split(";") if stmt.strip()]


def migrate(host: str, port: int, user: str, password: str, database: str) -> list[str]:
    conn = pymysql.connect(host=host, port=port, user=user, password=password, autocommit=True)
    applied_now = []
    try:
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
            for path in sorted(MIGRATIONS.glob("*.sql")):
                if path.name in done:
                    continue
                for stmt in _statements(path.read_text()):
                    cur.execute(stmt)
                cur.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (path.name,))
                applied_now.append(path.name)
    finally:
        conn.close()
    return applied_now


def main() -> int:
    env = os.environ
    applied = migrate(
        env.get("DB_HOST", "127.0.0.1"),
        int(env.get("DB_PORT", "3306")),
        env.get("DB_USER", "root"),
        env.get("DB_PASSWORD", ""),
        env.get("DB_NAME", "hotledger"),
    )
    print(f"migrations applied: {', '.join(applied) if applied else 'none (up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
