"""Ids never repeat after a lost worker-id lease (issue 10, item 12), on the real Redis: Redis loses the lease
key of a process that keeps issuing, another process claims the same worker id and issues too."""

from __future__ import annotations

import threading
import time

from hotledger import keys
from hotledger.dal.ids import SEQUENCE_BITS, WORKER_BITS, IdGenerator


def worker_of(id_: int) -> int:
    return (id_ >> SEQUENCE_BITS) & ((1 << WORKER_BITS) - 1)


def test_a_worker_id_taken_over_after_redis_lost_its_lease_never_repeats_an_id(settings):
    """Before the fix: A went on issuing on its worker id for up to a second after the loss while B, having
    claimed the same id, issued at once: duplicate ids (same millisecond, worker and sequence)."""
    from hotledger.dal.redis_store import Lua, connect

    lua = Lua(connect(settings), settings.lua_dir)
    a, b = IdGenerator(lua), IdGenerator(lua)
    worker = worker_of(a.next_id())
    from_a, from_b, stop = [], [], threading.Event()

    def a_keeps_issuing():
        while not stop.is_set():
            from_a.append(a.next_id())

    thread = threading.Thread(target=a_keeps_issuing)
    thread.start()
    try:
        time.sleep(0.05)
        lua.client.delete(keys.IDGEN_WORKER_PREFIX + str(worker))  # failover: A's lease key is gone
        lua.client.set(keys.IDGEN_WORKER_PREFIX + "next", worker - 1)  # B's claim lands on A's worker id
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            from_b.append(b.next_id())
    finally:
        stop.set()
        thread.join()
    assert worker_of(from_b[0]) == worker  # B did take A's worker id
    issued = from_a + from_b
    assert len(set(issued)) == len(issued), f"{len(issued) - len(set(issued))} ids issued twice"
    assert worker_of(a.next_id()) != worker  # A moved on to another worker id
