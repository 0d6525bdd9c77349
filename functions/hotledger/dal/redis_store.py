"""Redis connection, the Lua scripts of layers/lua, and the translation of redis-py errors.

Only dal/ and the features' store.py talk to redis-py. Above them a Redis failure is one of two things:
RedisUnavailable (the command cannot have run: nothing changed) or RedisOutcomeUnknown (it was sent and its
answer lost: it may have run). Each feature's store wraps its scripts in typed methods over Lua.run."""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, overload
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.client import Pipeline, PubSub
from redis.cluster import ClusterNode, ClusterPipeline
from redis.commands.core import Script
from redis.retry import Retry

from hotledger.config import CLUSTER_SCHEMES, Settings, settings
from hotledger.ledger.kinds import lua_kinds


class RedisUnavailable(Exception):
    """Redis could not be reached: the command cannot have run, nothing changed."""


class RedisOutcomeUnknown(RedisUnavailable):
    """The command was sent and its answer lost (timeout, connection dropped mid-command): it may have run."""


class RedisCommandError(RedisOutcomeUnknown):
    """Redis ran the command and refused it (a script error: writes made before the error stand)."""


def translate(exc: redis.RedisError) -> RedisUnavailable:
    kind: type[RedisUnavailable]
    if isinstance(exc, redis.ResponseError):
        kind = RedisCommandError
    else:
        kind = RedisUnavailable if never_ran(exc) else RedisOutcomeUnknown
    return kind(f"{type(exc).__name__}: {exc}")


_P = ParamSpec("_P")
_R = TypeVar("_R")
_C = TypeVar("_C", bound=type)

# what a script takes in ARGV (redis-py encodes each)
ScriptArg = bytes | str | int | float


def redis_errors_translated(cls: _C) -> _C:
    """Class decorator for stores and dal classes: their public methods raise RedisUnavailable /
    RedisOutcomeUnknown instead of redis-py's errors."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_") or getattr(member, "_scripts_translate", False):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            setattr(cls, name, type(member)(_translating(member.__func__)))
        elif callable(member):
            setattr(cls, name, _translating(member))
    return cls


def scripts_only(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Marks a store method whose only Redis calls are Lua.run's, which translates their errors itself:
    redis_errors_translated leaves it as it is (a second translation around every charge's script)."""
    setattr(method, "_scripts_translate", True)  # noqa: B010
    return method


def _translating(method: Callable[_P, _R]) -> Callable[_P, _R]:
    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except redis.RedisError as exc:
            raise translate(exc) from exc

    return call


_INCLUDE = re.compile(r"^--! include (\w+)$", re.M)
# a piece's function: `local function name(` at the line's start, to the line's own `end` or the next line that is
# `end` alone (the pieces' layout; tests/unit/test_lua_library.py holds them to it)
_FUNCTION = re.compile(r"^local function (\w+)\((?:[^\n]*\bend|.*?\nend)$\n?", re.M | re.S)
# a comment, or a quoted string (group 1: kept, `--` in it starts no comment)
_COMMENT = re.compile(r"""('(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")|--[^\n]*""")


def script_text(path: Path) -> str:
    """A script of layers/lua as Redis runs it: each `--! include <name>` line replaced by layers/lua/lib/<name>.lua,
    so a piece several scripts need (the rebuild hold's check, the entry string, the event JSON) is written once.
    A piece may include another; each is expanded once per script, where it is first named. `kinds` is generated
    from ledger/kinds.py (lua_kinds), so the scripts and the Python read one table of kinds."""
    lib, included = path.parent / "lib", set()

    def expand(text: str) -> str:
        return _INCLUDE.sub(piece, text)

    def piece(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in included:
            return ""
        included.add(name)
        return lua_kinds() if name == "kinds" else expand((lib / f"{name}.lua").read_text())

    return without_unused_functions(expand(path.read_text()))


def without_unused_functions(text: str) -> str:
    """The script without the pieces' functions it never calls: a script's top level runs at every EVALSHA, so each
    function it defines is a closure made and collected per call (about 700 instructions on a hot deduct's thread)."""
    while True:
        code = _COMMENT.sub(lambda found: found.group(1) or "", text)
        unused = [
            match
            for match in _FUNCTION.finditer(text)
            if len(re.findall(rf"\b{match.group(1)}\b", code)) == 1  # its definition alone
        ]
        if not unused:
            return text
        for match in reversed(unused):
            text = text[: match.start()] + text[match.end() :]


class Lua:
    """The scripts of layers/lua by file name; each call goes out as EVALSHA (EVAL once on NOSCRIPT).
    Features call them through their store's typed wrappers, never by name."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, lua_dir: str):
        self.client = client
        self._scripts = {
            path.stem: client.register_script(script_text(path)) for path in sorted(Path(lua_dir).glob("*.lua"))
        }

    def run(
        self,
        name: str,
        keys: list[str],
        args: Sequence[ScriptArg],
        client: redis.Redis | redis.RedisCluster | ScriptsPipeline | None = None,
    ) -> Any:
        """Run one script; with a pipeline as client it is queued there and its reply comes from execute().
        The reply is redis-py's, untyped (Any): its shape is the script's, which each store's typed wrapper knows
        and converts (an int, bytes, an array of them, ...)."""
        if isinstance(client, ScriptsPipeline):
            return client.queue(self._scripts[name], keys, args)
        try:
            return self._scripts[name](keys=keys, args=args, client=client)
        except redis.RedisError as exc:
            raise translate(exc) from exc

    def pipeline(self) -> ScriptsPipeline | Pipeline:
        """A pipeline without a transaction (scripts and other commands; their replies come from execute())."""
        if isinstance(self.client, redis.RedisCluster):
            return ScriptsPipeline(self.client)
        return self.client.pipeline(transaction=False)

    def sha(self, name: str) -> str:
        """The script's SHA1 (EVALSHA), for benchmarks that call it without redis-py."""
        return self._scripts[name].sha


class ScriptsPipeline:
    """A cluster pipeline (one round trip per master) whose scripts survive a master that lacks them: a replica
    promoted by a failover has an empty script cache, and redis-py loads scripts for plain pipelines only. Replies
    NOSCRIPT are run again one by one, which loads the script (every script is safe to run twice, and these ran
    not at all). Other commands are queued on it as on any pipeline."""

    def __init__(self, client: redis.RedisCluster):
        self._client = client
        # redis-py leaves RedisCluster.pipeline unannotated (it answers a ClusterPipeline)
        self._pipe: ClusterPipeline = client.pipeline(transaction=False)  # type: ignore[no-untyped-call]
        # position in the pipeline -> (script, keys, args)
        self._scripts: dict[int, tuple[Script, list[str], Sequence[ScriptArg]]] = {}

    def queue(self, script: Script, keys: list[str], args: Sequence[ScriptArg]) -> Any:
        self._scripts[len(self._pipe)] = (script, keys, args)
        # redis-py blocks the evalsha method on cluster pipelines (it cannot load scripts there), and a cluster
        # pipeline asks the client's default node for an EVALSHA's keys (COMMAND GETKEYS): a dead default node then
        # fails every pipeline until something else makes the client discover the cluster again. Every script's
        # keys share one hash tag, so the slot is computed here and the command sent to its master; a resend after
        # a connection error (redis-py's, one by one) routes by the keys on the client as well.
        # redis-py leaves RedisCluster.get_node_from_key unannotated (it answers a ClusterNode)
        node: ClusterNode = self._client.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
        # redis-py leaves ClusterPipeline.execute_command unannotated (it answers the pipeline)
        return self._pipe.execute_command(  # type: ignore[no-untyped-call]
            "EVALSHA", script.sha, len(keys), *keys, *args, target_nodes=node
        )

    def __getattr__(self, command: str) -> Any:
        """Any other command, queued on the cluster pipeline (redis-py's commands, untyped replies)."""
        return getattr(self._pipe, command)

    def execute(self) -> list[Any]:
        replies = self._pipe.execute(raise_on_error=False)
        for position, reply in enumerate(replies):
            if isinstance(reply, redis.exceptions.NoScriptError) and position in self._scripts:
                script, keys, args = self._scripts[position]
                replies[position] = script(keys=keys, args=args)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies


class AttemptsKept(Retry):
    """redis-py's Retry that keeps every attempt's error on the error it finally raises (`exc.attempts`, first to
    last). Whether a command may have run depends on every attempt: one that timed out after Redis ran the
    script, followed by resends refused at connect, must not read as "nothing changed" (never_ran)."""

    def call_with_retry(
        self,
        do: Callable[[], _R],
        fail: Callable[[Exception], Any] | Callable[[Exception, int], Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> _R:
        attempts: list[Exception] = []

        def attempt() -> _R:
            try:
                return do()
            except Exception as error:
                attempts.append(error)
                raise

        try:
            return super().call_with_retry(attempt, fail, is_retryable, with_failure_count)
        except Exception as error:
            keep_attempts(error, tuple(attempts))
            raise


SOCKET_TIMEOUT_S = CONNECT_TIMEOUT_S = 2.0
RETRIES, BACKOFF_BASE_S, BACKOFF_CAP_S = 2, 0.02, 0.2
# the longest one call keeps resending: every attempt may wait for its connect and for its reply (plus the
# health check PING); the scripts' resend evidence (ledger_settle, voucher_settle) outlives this many times over
RETRY_HORIZON_S = (RETRIES + 1) * (CONNECT_TIMEOUT_S + 2 * SOCKET_TIMEOUT_S) + RETRIES * BACKOFF_CAP_S


class AttemptsKeptCluster(redis.RedisCluster):
    """RedisCluster resends a command after a connection error in a loop of its own (a failover moves the slot
    meanwhile), not through its Retry: keep every attempt's error on the error it finally raises, as AttemptsKept
    does, for never_ran."""

    def __init__(self, *args: Any, seeds: tuple[tuple[str, int], ...] = (), **kwargs: Any):
        self._attempts = threading.local()  # before the base class's start-up, which runs commands already
        super().__init__(*args, **kwargs)
        if seeds:
            self._keep_seeds(seeds)

    def _keep_seeds(self, seeds: tuple[tuple[str, int], ...]) -> None:
        """Keep the configured addresses among the nodes a topology refresh starts from. redis-py replaces them with
        the nodes it discovered (dynamic_startup_nodes), which drops an ElastiCache configuration endpoint (a DNS
        name that follows the nodes replacing lost ones, while the cluster announces addresses): once every
        discovered node is gone, nothing would be left to find the cluster from. The discovered nodes stay too:
        a local cluster's seeds are some of its nodes, and any of them may be the one lost."""
        manager = self.nodes_manager
        initialize = manager.initialize

        def keep() -> None:
            missing = [(host, port) for host, port in seeds if f"{host}:{port}" not in manager.startup_nodes]
            if missing:
                # a new dict: redis-py's startup nodes are its node cache itself after a discovery
                # redis-py leaves ClusterNode's constructor unannotated
                added = {f"{h}:{p}": ClusterNode(h, p) for h, p in missing}  # type: ignore[no-untyped-call]
                manager.startup_nodes = {**manager.startup_nodes, **added}

        def initialize_keeping_seeds(*args: Any, **kwargs: Any) -> object:
            try:
                return initialize(*args, **kwargs)
            finally:
                keep()

        # redis-py's own, wrapped on this one instance (setattr: a method is not assigned to, but here it is meant)
        setattr(manager, "initialize", initialize_keeping_seeds)  # noqa: B010
        keep()

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self._attempts.errors = []
        try:
            # redis-py leaves RedisCluster.execute_command unannotated (its reply is the command's, untyped)
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except Exception as error:
            keep_attempts(error, tuple(self._attempts.errors) or (error,))
            raise

    def _execute_command(self, target_node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        try:
            # redis-py leaves RedisCluster._execute_command unannotated (its reply is the command's, untyped)
            return super()._execute_command(target_node, *args, **kwargs)  # type: ignore[no-untyped-call]
        except Exception as error:
            getattr(self._attempts, "errors", []).append(error)
            raise


def node_started_at_ms(client: redis.Redis | redis.RedisCluster, key: str) -> int:
    """When the Redis node that holds `key` started, epoch ms by its own clock (INFO server). A node that restarted
    empty less than a publish's timeout ago may have lost changes whose publish was still in flight then."""
    if isinstance(client, redis.RedisCluster):
        # redis-py leaves get_node_from_key and get_redis_connection unannotated
        node = client.get_redis_connection(client.get_node_from_key(key))  # type: ignore[no-untyped-call]
        info: dict[str, Any] = node.info("server")
    else:
        info = client.info("server")
    return int(info["server_time_usec"]) // 1000 - int(info["uptime_in_seconds"]) * 1000


def connect(cfg: Settings) -> redis.Redis | redis.RedisCluster:
    """One client for the configured Redis: a RedisCluster (it follows MOVED and failovers, one connection pool per
    master) when REDIS_CLUSTER=1 or the URL's scheme is redis+cluster / rediss+cluster, else a plain client. Both
    run the same commands: every script's keys share one hash tag, so one slot."""
    options = dict(
        username=cfg.redis_username,  # ElastiCache RBAC: AUTH <user> <password>; None: the default user
        password=cfg.redis_password,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=30,
        # resending after a timeout is safe: every script recognises a resend of itself (ledger_apply by its entry,
        # also after the writer settled it, for RETRY_HORIZON_S and more); two retries keep a dead Redis from
        # holding a request for long. Each attempt is kept, so an outcome is unknown when any attempt may have run.
        retry=AttemptsKept(ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), RETRIES),
    )
    if cfg.redis_is_cluster:
        url, seeds = cluster_seeds(cfg.redis_url)
        others = [ClusterNode(host, port) for host, port in seeds[1:]]  # type: ignore[no-untyped-call]
        return AttemptsKeptCluster.from_url(url, seeds=seeds, startup_nodes=others, **options)
    return redis.Redis.from_url(cfg.redis_url, **options)


def cluster_seeds(redis_url: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """A cluster's REDIS_URL names one seed node or several, comma-separated, as every cluster client takes them
    (`rediss+cluster://user:pass@10.0.0.1:6379,10.0.0.2:6379/0`): a process starts while any one of them lives.
    Returns the URL with its first seed alone (redis-py's from_url reads the scheme, credentials and options from
    it) and every seed as (host, port)."""
    scheme, rest = redis_url.split("://", 1)
    plain = scheme.removesuffix("+cluster") if scheme in CLUSTER_SCHEMES else scheme
    cut = min((rest.index(c) for c in "/?" if c in rest), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, _, hosts = netloc.rpartition("@")
    seeds = []
    for hostport in hosts.split(","):
        parsed = urlsplit(f"{plain}://{hostport.strip()}")
        if not parsed.hostname:
            raise ValueError(f"REDIS_URL: {hostport!r} is not host:port")
        seeds.append((parsed.hostname, parsed.port or 6379))
    first = f"{seeds[0][0]}:{seeds[0][1]}" if ":" not in seeds[0][0] else f"[{seeds[0][0]}]:{seeds[0][1]}"
    return f"{plain}://{userinfo + '@' if userinfo else ''}{first}{tail}", tuple(seeds)


@functools.lru_cache(maxsize=1)
def lua() -> Lua:
    """The process's Redis connection with the scripts of LUA_DIR."""
    cfg = settings()
    return Lua(connect(cfg), cfg.lua_dir)


def stream_flag(cfg: Settings) -> str:
    """The scripts' ARGV switch: 'stream' makes them XADD their event to the Redis Stream (EVENT_TRANSPORT=redis-stream)."""
    return "stream" if cfg.event_transport == "redis-stream" else ""


def expire_once(client: redis.Redis | redis.RedisCluster, names: list[str], ttl_s: int) -> None:
    """Give keys a TTL unless they have one (EXPIRE NX), so repeating this does not push it back."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.expire(name, ttl_s, nx=True)
    pipe.execute()


@overload
def text(value: bytes | str) -> str: ...
@overload
def text(value: None) -> None: ...
def text(value: bytes | str | None) -> str | None:
    """A Redis reply as text (redis-py answers bytes); None stays None (a missing key or field)."""
    return value.decode() if isinstance(value, bytes) else value


def never_ran(exc: redis.RedisError) -> bool:
    """True when every attempt redis-py made (AttemptsKept) was refused at connect: the command cannot have
    reached Redis. One attempt that timed out or lost its connection mid-command leaves the outcome unknown,
    whatever the later attempts met."""
    return all(isinstance(attempt.__context__, ConnectionRefusedError) for attempt in attempts_of(exc) or (exc,))


def keep_attempts(error: BaseException, attempts: tuple[BaseException, ...]) -> None:
    """Keep every attempt's error on the error finally raised (never_ran reads them with attempts_of); an attribute
    of the exception's own, which its type does not declare."""
    setattr(error, "attempts", attempts)  # noqa: B010


def attempts_of(error: BaseException) -> tuple[BaseException, ...]:
    """The attempts keep_attempts kept on the error; () when it kept none."""
    attempts: tuple[BaseException, ...] | None = getattr(error, "attempts", None)
    return attempts or ()


def shard_subscription(client: redis.Redis | redis.RedisCluster, channels: list[str]) -> PubSub:
    """A sharded pub/sub subscription (SSUBSCRIBE, Redis 7): on a cluster each channel is heard on the master of
    its slot, where the scripts SPUBLISH it; on one Redis it works the same."""
    # redis-py leaves pubsub() unannotated (a PubSub; a ClusterPubSub, its subclass, on a cluster)
    pubsub: PubSub = client.pubsub()  # type: ignore[no-untyped-call]
    pubsub.ssubscribe(*channels)
    return pubsub


# a cluster subscription listens on one connection per master in turn: each wait is this short, so a message on
# any master is seen within it
LISTEN_SLICE_S = 0.05


def wait_for_message(pubsub: PubSub, timeout_s: float, addressed_to: str | None = None) -> bool:
    """Sleep until a published message arrives (True) or timeout_s passes (False); subscribe confirmations
    do not count, nor, with addressed_to, messages whose payload names someone else."""
    end = time.monotonic() + timeout_s
    while (left := end - time.monotonic()) > 0:
        message = pubsub.get_sharded_message(timeout=min(left, LISTEN_SLICE_S))
        if message is None and not pubsub.subscribed:
            time.sleep(min(left, LISTEN_SLICE_S))  # nothing to listen on (a failover dropped it): no busy loop
        if message and message["type"] == "smessage" and addressed_to in (None, text(message["data"])):
            return True
    return False


def reply_fields(raw: Iterable[bytes | str | int]) -> list[str]:
    """A script's array reply as text: [status, field, ...] (integers as their decimal text)."""
    return [str(x) if isinstance(x, int) else text(x) for x in raw]
