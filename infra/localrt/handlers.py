"""What every kind of local trigger needs: a function's handler loaded as Lambda loads it, and signals noted for a
main loop to act on."""

from __future__ import annotations

import importlib
import os
import signal
import sys

from infra.localrt import template


def load_handler(fn: template.Function):
    if str(fn.code_dir) not in sys.path:
        sys.path.insert(0, str(fn.code_dir))
    if fn.layer_dirs:
        os.environ.setdefault("LUA_DIR", str(fn.layer_dirs[0]))
    module, attr = fn.handler.rsplit(".", 1)
    return getattr(importlib.import_module(module), attr)


def note_signals() -> list:
    """SIGTERM and SIGINT are only noted (appended to the list returned): the main loop acts on them. A handler
    that takes a lock (Event.set) can deadlock against the very code it interrupted."""
    noted: list = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _frame: noted.append(signum))
    return noted
