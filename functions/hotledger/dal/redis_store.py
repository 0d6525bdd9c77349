"""Redis connection, the Lua scripts of layers/lua, and the translation of redis-py errors.

Only dal/ and the features' store.py talk to redis-py. Above them a Redis failure is one of two things:
RedisUnavailable (the command cannot have run: nothing changed) or RedisOutcomeUnknown (it was sent and its
answer lost: it may have run). Each feature's store wraps its scripts in typed methods over Lua.run."""
from __future__ import annotations

import functools
import time
from pathlib import Path

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from hotledger.config import Settings, settings


class RedisUnavailable(Exception):
    """Redis could not be reached: the command cannot have run, nothing changed."""


class RedisOutcomeUnknown(RedisUnavailable):
    """The command was sent and its answer lost (timeout, connection dropped mid-command): it may have run."""


class RedisCommandError(RedisOutcomeUnknown):
    """Redis ran the command and refused it (a script error: writes made before the error stand)."""


def translate(exc: redis.RedisError) -> RedisUnavailable:
    if isinstance(exc, redis.ResponseError):
        kind = RedisCommandError
    else:
        kind = RedisUnavailable if never_ran(exc) else RedisOutcomeUnknown
    return kind(f"{type(exc).__name__}: {exc}")


def redis_errors_translated(cls):
    """Class decorator for stores and dal classes: their public methods raise RedisUnavailable /
    RedisOutcomeUnknown instead of redis-py's errors."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            setattr(cls, name, type(member)(_translating(member.__func__)))
        elif callable(member):
            setattr(cls, name, _translating(member))
    return cls


def _translating(method):
    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except redis.RedisError as exc:
            raise translate(exc) from exc

    return call


class Lua:
    """The scripts of layers/lua by file name; each call goes out as EVALSHA (EVAL once on NOSCRIPT).
    Features call them through their store's typed wrappers, never by name."""

    def __init__(self, client: redis.Redis, lua_dir: str):
        self.client = client
        self._scripts = {path.stem: client.register_script(path.read_text()) for path in sorted(Path(lua_dir).glob("*.lua"))}

    def run(self, name: str, keys: list[str], args: list, client=None):
        """Run one script; with a pipeline as client it is queued there and its reply comes from execute()."""
        try:
            return self._scripts[name](keys=keys, args=args, client=client)
        except redis.RedisError as exc:
            raise translate(exc) from exc

    def pipeline(self):
        return self.client.pipeline(transaction=False)

    def sha(self, name: str) -> str:
        """The script's SHA1 (EVALSHA), for benchmarks that call it without redis-py."""
        return self._scripts[name].sha



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
def lua() -> Lua:
    """The process's Redis connection with the scripts of LUA_DIR."""
    cfg = settings()
    return Lua(connect(cfg), cfg.lua_dir)


def stream_flag(cfg: Settings) -> str:
    """The scripts' ARGV switch: 'stream' makes them XADD their event to the Redis Stream (EVENT_TRANSPORT=redis-stream)."""
    return "stream" if cfg.event_transport == "redis-stream" else ""


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


def reply_fields(raw) -> list[str]:
    """A script's array reply as text: [status, field, ...] (integers as their decimal text)."""
    return [str(x) if isinstance(x, int) else text(x) for x in raw]
