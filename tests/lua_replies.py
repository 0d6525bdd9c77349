"""Every reply a Lua script's header states is produced by at least one test (issue 19: close the class, not the list).

Each script's header lists its status replies as `{'status', ...}`. This plugin records the status of every script
reply the in-process tests get (Lua.run) and, after a whole default run of the suite on one Redis (`make test`'s
first step: no file, -k or -m narrowing it, and not the cluster run, which leaves tests out), fails the run naming
each stated reply no test produced: a branch of a script nothing reaches is a branch nothing checks."""

from __future__ import annotations

import re
from pathlib import Path

LUA = Path(__file__).resolve().parents[1] / "layers" / "lua"
SEEN: set[tuple[str, str]] = set()


def stated_replies() -> set[tuple[str, str]]:
    """(script, status) of every status reply the scripts' headers state."""
    stated = set()
    for path in sorted(LUA.glob("*.lua")):
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("--"):
                break
            header.append(line)
        stated |= {(path.stem, status) for status in re.findall(r"\{'([a-z_]+)'", "\n".join(header))}
    return stated


def record() -> None:
    """Wrap Lua.run: the status of each reply (its first element, a string) is noted."""
    from hotledger.dal import redis_store

    run = redis_store.Lua.run

    def recording(self, name, keys, args, client=None):
        reply = run(self, name, keys, args, client)
        status = reply[0] if isinstance(reply, list) and reply else reply
        if isinstance(status, bytes):
            status = status.decode()
        if isinstance(status, str):
            SEEN.add((name, status))
        return reply

    redis_store.Lua.run = recording


def whole_default_run(config) -> bool:
    args = [Path(a).resolve() for a in config.args]
    return (
        not config.option.keyword
        and not config.option.markexpr
        and not config.option.deselect
        and args in ([], [Path(config.rootpath).resolve()], [Path(config.rootpath, "tests").resolve()])
    )


def missing() -> set[tuple[str, str]]:
    return stated_replies() - SEEN
