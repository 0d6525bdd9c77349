"""Apply infra/migrations/*.sql in order, once each (recorded in schema_migrations). Idempotent.

Usage: python infra/migrate.py   (connection from DB_HOST, DB_PORT, DB_USER, DB_PASSWORD, DB_NAME; PYTHONPATH=functions:.)
In AWS the stack's setup custom resource applies the same files on every deploy (functions/setup/app.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pymysql

from hotledger.dal.schema import migrate as apply_migrations

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def migrate(host: str, port: int, user: str, password: str, database: str) -> list[str]:
    conn = pymysql.connect(host=host, port=port, user=user, password=password, autocommit=True)
    try:
        return apply_migrations(conn, database, MIGRATIONS)
    finally:
        conn.close()


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
