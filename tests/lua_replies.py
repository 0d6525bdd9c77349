"""Every reply a Lua script's header states is produced by at least one test (issue 19: close the class, not the list;
issue 35: the integer replies too).

A script's header states its replies in one of two forms. Status replies, `{'status', ...}`, are read from the
header. Integer replies (`Returns 1 when renewed, 0 when the owner no longer holds it`: a compare-and-set that lost,
a receipt no longer current, a renewal by a caller that does not own the lock) are stated in prose, so each such
script is listed here with the values its header names (INTEGER_REPLIES); a script whose reply is data rather than a
decision, or that runs only in a pipeline (whose replies come from execute(), not Lua.run), is listed in NO_DECISION
with the reason. tests/unit/test_lua_replies.py holds every script of layers/lua to one of these (a new script
must be classified) and each integer script's header to the values listed.

This plugin records the reply of every script the in-process tests run (Lua.run) and, after a whole default run of
the suite on one Redis (`make test`'s first step: no file, -k or -m narrowing it, and not the cluster run, which
leaves tests out), fails the run naming each stated reply no test produced: a branch of a script nothing reaches is a
branch nothing checks. LUA_REPLIES_CHECK=<script>[,<script>...] checks those scripts' replies after any run (a
narrow run of the tests that produce them)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

LUA = Path(__file__).resolve().parents[1] / "layers" / "lua"
SEEN: set[tuple[str, str]] = set()
_CAPTURES: list[set[tuple[str, str]]] = []  # produced() blocks open now

# script -> (shape, the values its header states). shape: "one" an integer (any other than those named counts as
# "n": ledger_set_open's new version), or nil ("false": outbox_stream_revive's dead entry not there; a string reply
# is "id"); "each" an array of integers, one per item; "first" an array whose first element is the integer
INTEGER_REPLIES: dict[str, tuple[str, frozenset[str]]] = {
    "delay_ack": ("each", frozenset({"1", "0"})),
    "delay_dead": ("each", frozenset({"1", "0"})),
    "delay_extend": ("each", frozenset({"1", "0"})),
    "delay_offer": ("first", frozenset({"1", "0"})),
    "delay_remove": ("one", frozenset({"1", "0"})),
    "delay_retry": ("each", frozenset({"0", "1", "2"})),
    "ids_lease": ("one", frozenset({"1", "0"})),
    "journey_done": ("one", frozenset({"1", "0"})),
    "ledger_cache_update": ("one", frozenset({"1", "0"})),
    "ledger_load": ("one", frozenset({"1", "0"})),
    "ledger_post": ("one", frozenset({"1", "0"})),
    "ledger_set_open": ("one", frozenset({"n", "0"})),
    "lock_renew": ("one", frozenset({"1", "0"})),
    "outbox_stream_revive": ("one", frozenset({"id", "false"})),
    "redpacket_load": ("one", frozenset({"1", "0"})),
    "voucher_load": ("one", frozenset({"1", "0"})),
}
NO_DECISION: dict[str, str] = {
    "delay_take": "the elements taken and when the next is due: data",
    "inbox_pull": "the message ids after the client's last: data",
    "ledger_settle": "counts of what the writer's settle removed: data",
    "outbox_claim": "runs only in a pipeline (its marks come from execute()); tests/integration/test_rolled_back.py",
    "outbox_hold_swap": "the value hold_log holds after the call: data",
    "redpacket_settle": "runs only in a pipeline; counts of what it removed: data",
    "voucher_settle": "counts of what the writer's settle removed and counted late: data",
}


def header(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def status_replies(path: Path) -> set[str]:
    """The `{'status', ...}` replies a script's header states."""
    return set(re.findall(r"\{'([a-z_]+)'", header(path)))


def stated_replies() -> set[tuple[str, str]]:
    """(script, reply) of every reply the scripts' headers state: status replies, and integer ones as listed."""
    stated = set()
    for path in sorted(LUA.glob("*.lua")):
        stated |= {(path.stem, status) for status in status_replies(path)}
        stated |= {(path.stem, value) for value in INTEGER_REPLIES.get(path.stem, ("", ()))[1]}
    return stated


def replies_of(name: str, reply) -> set[str]:
    """What a script's reply states: its status (the first element, a string), or for an integer script its
    value(s) as INTEGER_REPLIES names them."""
    status = reply[0] if isinstance(reply, list) and reply else reply
    if isinstance(status, (bytes, str)) and (name not in INTEGER_REPLIES or isinstance(reply, list)):
        return {status.decode() if isinstance(status, bytes) else status}
    if name not in INTEGER_REPLIES:
        return set()
    shape, values = INTEGER_REPLIES[name]

    def value(v) -> str:
        if v is None:
            return "false"
        if isinstance(v, (bytes, str)):
            return "id"
        return str(v) if str(v) in values else "n"

    if shape == "each":
        return {value(v) for v in reply} if isinstance(reply, list) else set()
    if shape == "first":
        return {value(reply[0])} if isinstance(reply, list) and reply else set()
    return {value(reply)}


def record() -> None:
    """Wrap Lua.run: what each reply states (replies_of) is noted."""
    from hotledger.dal import redis_store

    run = redis_store.Lua.run

    def recording(self, name, keys, args, client=None):
        reply = run(self, name, keys, args, client)
        if client is None or not hasattr(client, "execute"):  # a pipelined call's reply comes from execute()
            noted = {(name, r) for r in replies_of(name, reply)}
            SEEN.update(noted)
            for capture in _CAPTURES:
                capture.update(noted)
        return reply

    redis_store.Lua.run = recording


@contextlib.contextmanager
def produced() -> Iterator[set[tuple[str, str]]]:
    """The (script, reply) pairs the scripts run within the block answered (a test asserts the reply it is about)."""
    capture: set[tuple[str, str]] = set()
    _CAPTURES.append(capture)
    try:
        yield capture
    finally:
        _CAPTURES[:] = [c for c in _CAPTURES if c is not capture]


def whole_default_run(config) -> bool:
    args = [Path(a).resolve() for a in config.args]
    return (
        not config.option.keyword
        and not config.option.markexpr
        and not config.option.deselect
        and args in ([], [Path(config.rootpath).resolve()], [Path(config.rootpath, "tests").resolve()])
    )


def missing(scripts: set[str] | None = None) -> set[tuple[str, str]]:
    """Stated replies no test produced (of `scripts` only, when given)."""
    return {(script, r) for script, r in stated_replies() - SEEN if scripts is None or script in scripts}


def checked_scripts() -> set[str]:
    """The scripts LUA_REPLIES_CHECK names for a narrow run's check."""
    return {s.strip() for s in os.environ.get("LUA_REPLIES_CHECK", "").split(",") if s.strip()}
