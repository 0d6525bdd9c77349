"""Redis connection and the Lua scripts of layers/lua, one Script object per file."""
from __future__ import annotations

import functools
import time
from pathlib import Path

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from hotledger.config import Settings, settings


class Scripts:
    """Every layers/lua/<name>.lua as an attribute <name>; calls go out as EVALSHA (EVAL once on NOSCRIPT)."""

    def __init__(self, client: redis.Redis, lua_dir: str):
        self.client = client
        for path in sorted(Path(lua_dir).glob("*.lua")):
            setattr(self, path.stem, client.register_script(path.read_text()))


def connect(cfg: Settings) -> redis.Redis:
    return redis.Redis.from_url(
        cfg.redis_url,
        password=cfg.redis_password,
        socket_timeout=2.0,
        socket_connect_timeout=2.0,
        health_check_interval=30,
        # resending after a timeout is safe: every script is idempotent (ledger_apply answers a resent call
        # from its entry); two retries keep a dead Redis from holding a request for long
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
    )


@functools.lru_cache(maxsize=1)
def scripts() -> Scripts:
    cfg = settings()
    return Scripts(connect(cfg), cfg.lua_dir)


def expire_once(client: redis.Redis, names: list[str], ttl_s: int) -> None:
    """Give keys a TTL unless they have one (EXPIRE NX), so repeating this does not push it back."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.expire(name, ttl_s, nx=True)
    pipe.execute()


def text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def never_ran(exc: redis.RedisError) -> bool:
    """True when the connection was refused: the command cannot have reached Redis. A timeout or a
    connection lost mid-command leaves its outcome unknown."""
    return isinstance(exc.__context__, ConnectionRefusedError)


def wait_for_message(pubsub, timeout_s: float, addressed_to: str | None = None) -> bool:
    """Sleep until a published message arrives (True) or timeout_s passes (False); subscribe confirmations
    do not count, nor, with addressed_to, messages whose payload names someone else."""
    end = time.monotonic() + timeout_s
    while (left := end - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=left)
        if message and message["type"] == "message" and addressed_to in (None, text(message["data"])):
            return True
    return False
