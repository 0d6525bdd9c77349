"""The operators' log (t_ops_log): every replay an operator made, who made it, what was asked and what came of it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hotledger.dal import db


@dataclass(frozen=True)
class OpsLogLine:
    log_id: int
    actor: str
    action: str
    detail: dict[str, Any]
    created_at: int


class OpsLog:
    @staticmethod
    def write(actor: str, action: str, detail: dict[str, Any], now_ms: int) -> int:
        with db.transaction() as cur:
            cur.execute(
                "INSERT INTO t_ops_log (actor, action, detail, created_at) VALUES (%s, %s, %s, %s)",
                (actor[:200], action, json.dumps(detail, separators=(",", ":"), default=str), now_ms),
            )
            return int(cur.lastrowid)

    @staticmethod
    def write_once(
        subject: str, actor: str, action: str, detail: dict[str, Any], now_ms: int
    ) -> tuple[dict[str, Any], bool]:
        """The line about `subject` and whether this call wrote it: the first call writes it, every later one (a retry
        of the action) reads it back."""
        with db.transaction() as cur:
            cur.execute(
                "INSERT INTO t_ops_log (actor, action, detail, created_at, subject) VALUES (%s, %s, %s, %s, %s)"
                " ON DUPLICATE KEY UPDATE id = id",
                (actor[:200], action, json.dumps(detail, separators=(",", ":"), default=str), now_ms, subject),
            )
            written = cur.rowcount == 1  # a duplicate's `id = id` changes no row: 0
            cur.execute("SELECT detail FROM t_ops_log WHERE subject = %s", (subject,))
            (stored,) = cur.fetchone()
        return dict(json.loads(stored)), written

    @staticmethod
    def lines(limit: int) -> list[OpsLogLine]:
        rows = db.query(
            "SELECT id, actor, action, detail, created_at FROM t_ops_log ORDER BY id DESC LIMIT %s", (limit,)
        )
        return [
            OpsLogLine(id_, actor, action, json.loads(detail), created) for id_, actor, action, detail, created in rows
        ]
