"""Delay-queue and lock benchmarks (called by bench/run.py; figures, never assertions).

- remove from a 100,000-element delay queue: ours (ZREM of the element itself) against a faithful
  re-implementation of Redisson's delayed queue (struct.pack'ed members in a zset and a side list; remove
  scans the list with LINDEX + struct.unpack), same elements, same run, same Redis.
- drain rate, and how late elements fire with the drainer sleeping until each due time.
- lock acquire+release per second, uncontended and contended (8 processes, one lock, 1 ms of work while
  held), and Redis commands per contended acquire: pub/sub waiting (ours) against SET NX polling (spin).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
import uuid

from workers import START_ALLOWANCE_S, gather

REDISSON_OFFER = """
local value = struct.pack('dLc0', tonumber(ARGV[2]), string.len(ARGV[3]), ARGV[3]);
redis.call('zadd', KEYS[2], ARGV[1], value);
redis.call('rpush', KEYS[3], value);
local v = redis.call('zrange', KEYS[2], 0, 0);
if v[1] == value then redis.call('publish', KEYS[4], ARGV[1]); end;
"""
REDISSON_REMOVE = """
local s = redis.call('llen', KEYS[1]);
for i = 0, s-1, 1 do
  local v = redis.call('lindex', KEYS[1], i);
  local randomId, value = struct.unpack('dLc0', v);
  if ARGV[1] == value then
    redis.call('zrem', KEYS[2], v);
    redis.call('lrem', KEYS[1], 1, v);
    return 1;
  end;
end;
return 0;
"""


def _pct(values: list[float], q: float) -> float:
    return round(statistics.quantiles(values, n=1000)[int(q * 1000) - 1], 3) if len(values) > 10 else float("nan")


def delay_remove(client, lua, elements: int, ours_removes: int, redisson_removes: int) -> dict:
    from hotledger import keys
    from hotledger.dal.delay_queue import DelayQueue

    queue, rng = f"bench-{uuid.uuid4().hex[:6]}", random.Random(1)
    names = [f"order-{i:08d}" for i in range(elements)]
    base = int(time.time() * 1000) + 86_400_000
    pipe = client.pipeline(transaction=False)
    for i, name in enumerate(names):
        lua.run("delay_offer", keys.delay_offer_keys(queue), [name, base + i], client=pipe)
        if i % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()
    dq = DelayQueue(lua)
    ours = []
    for name in rng.sample(names, ours_removes):
        started = time.perf_counter()
        dq.remove(queue, name)
        ours.append((time.perf_counter() - started) * 1000)
    client.delete(keys.delay_due(queue))

    rkeys = [
        f"redisson:{{{queue}}}",
        f"redisson_delay_queue_timeout:{{{queue}}}",
        f"redisson_delay_queue:{{{queue}}}",
        f"redisson_delay_queue_channel:{{{queue}}}",
    ]
    offer_sha, remove_sha = client.script_load(REDISSON_OFFER), client.script_load(REDISSON_REMOVE)
    for i, name in enumerate(names):
        pipe.evalsha(offer_sha, 4, *rkeys, base + i, rng.getrandbits(52), name)
        if i % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()
    theirs = []
    for name in rng.sample(names, redisson_removes):
        started = time.perf_counter()
        client.evalsha(remove_sha, 2, rkeys[2], rkeys[1], name)
        theirs.append((time.perf_counter() - started) * 1000)
    client.delete(*rkeys)
    return {
        "delay_remove_p50_ms_100k": _pct(ours, 0.5),
        "delay_remove_p99_ms_100k": _pct(ours, 0.99),
        "redisson_remove_p50_ms_100k": _pct(theirs, 0.5),
        "redisson_remove_p99_ms_100k": _pct(theirs, 0.99),
        "delay_remove_vs_redisson_ratio": round(_pct(ours, 0.99) / _pct(theirs, 0.99), 5),
    }


def delay_drain(client, lua, elements: int) -> dict:
    from hotledger import keys
    from hotledger.dal.delay_queue import DelayQueue, Drainer

    queue = f"bench-drain-{uuid.uuid4().hex[:6]}"
    now = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    for i in range(elements):
        lua.run("delay_offer", keys.delay_offer_keys(queue), [f"e{i}", now - 1], client=pipe)
    pipe.execute()
    drainer = Drainer(DelayQueue(lua), {queue: lambda batch: None}, batch=500)
    started = time.perf_counter()
    drainer.drain_due()
    drain_rate = elements / (time.perf_counter() - started)

    # lateness: elements due over the next 4 s, the drainer sleeping until each due time
    late_queue, fired = f"bench-late-{uuid.uuid4().hex[:6]}", []
    dq = DelayQueue(lua)

    def record(batch):
        at = time.time() * 1000
        fired.extend(at - int(e.split("@")[1]) for e in batch)

    stop = threading.Event()
    lateness_drainer = Drainer(dq, {late_queue: record}, batch=500)
    thread = threading.Thread(target=lateness_drainer.run, args=(lambda: not stop.is_set(),))
    thread.start()
    rng, start = random.Random(2), int(time.time() * 1000) + 500
    for i in range(2000):
        due = start + rng.randrange(0, 4000)
        dq.offer(late_queue, f"l{i}@{due}", due_at_ms=due)
    deadline = time.monotonic() + 15
    while len(fired) < 2000 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join()
    return {
        "delay_drain_per_s": round(drain_rate, 1),
        "delay_fire_lateness_p50_ms": _pct(fired, 0.5),
        "delay_fire_lateness_p99_ms": _pct(fired, 0.99),
        "delay_fired_early": sum(1 for x in fired if x < 0),
    }


def _lock_worker(kind: str, name: str, start_at: float, stop_at: float, hold_s: float, out) -> None:
    import clients

    clients.quiet()
    from hotledger.dal.lock import DistributedLock
    from hotledger.runtime import lua

    acquired = 0
    if kind == "pubsub":
        lock = DistributedLock(lua(), 5000, 30_000)
        commands_before = None
        while time.monotonic() < stop_at:
            with lock.hold(name):
                time.sleep(hold_s)
            if time.monotonic() >= start_at:  # counted in the window only (spawn and import before it)
                if commands_before is None:
                    commands_before = lock.commands
                acquired += 1
        out.put((acquired, lock.commands - (commands_before or lock.commands)))
        return
    client, commands = lua().client, 0  # the spin lock the billing path used before: SET NX PX, polled
    while time.monotonic() < stop_at:
        token, delay = uuid.uuid4().hex, 0.002
        counted = time.monotonic() >= start_at
        while True:
            commands += counted
            if client.set(f"spin:{{{name}}}", token, nx=True, px=5000):
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
        time.sleep(hold_s)
        lua().run("ids_lease", [f"spin:{{{name}}}"], [token, "release", 0])
        acquired += counted
    out.put((acquired, commands))


def _contended(kind: str, procs: int, seconds: float, hold_s: float) -> tuple[float, float]:
    name = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
    start_at = time.monotonic() + 8  # every worker spawned and imported (a shared 2-core machine)
    stop_at = start_at + seconds
    results = gather(_lock_worker, [(kind, name, start_at, stop_at, hold_s)] * procs, 8 + seconds + START_ALLOWANCE_S)
    acquired, commands = sum(a for a, _ in results), sum(c for _, c in results)
    return acquired / seconds, commands / max(acquired, 1)


def lock_figures(lua, procs: int, seconds: float) -> dict:
    from hotledger.dal.lock import DistributedLock

    lock, name, n = DistributedLock(lua, 5000, 1000), f"bench-solo-{uuid.uuid4().hex[:6]}", 0
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        lock.acquire(name)
        lock.release(name)
        n += 1
    contended_per_s, pubsub_commands = _contended("pubsub", procs, seconds, 0.001)
    spin_per_s, spin_commands = _contended("spin", procs, seconds, 0.001)
    return {
        "lock_acquire_release_per_s": round(n / seconds, 1),
        "lock_contended_acquire_release_per_s": round(contended_per_s, 1),
        "spin_lock_contended_acquire_release_per_s": round(spin_per_s, 1),
        "lock_commands_per_contended_acquire": round(pubsub_commands, 2),
        "spin_lock_commands_per_contended_acquire": round(spin_commands, 2),
    }
