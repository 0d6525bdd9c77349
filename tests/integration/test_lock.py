"""The distributed lock (dal/lock.py): reentrancy, owner-only release, pub/sub waiting, the watchdog, fencing
tokens checked by the SYNC deduct path, and a clear failure when Redis is unreachable. Real Redis and DB."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pymysql
import pytest
import redis

from hotledger import keys
from hotledger.dal.lock import DistributedLock, LockUnavailable, NotLockOwner
from hotledger.dal.redis_store import Lua, RedisOutcomeUnknown, RedisUnavailable
from hotledger.runtime import lua

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def name():
    return f"test-{uuid.uuid4().hex[:8]}"


def make_lock(lease_ms=5000, wait_ms=2000, **kw) -> DistributedLock:
    return DistributedLock(lua(), lease_ms, wait_ms, **kw)


def in_thread(fn):
    result = {}

    def run():
        try:
            result["value"] = fn()
        except Exception as exc:
            result["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


def test_reentrant_with_one_token_and_released_by_the_last_unlock(name, redis_client):
    lock = make_lock()
    first, again = lock.acquire(name), lock.acquire(name)
    assert first.fence == again.fence and redis_client.hget(keys.lock(name), lock.owner()) == b"2"
    lock.release(name)
    with pytest.raises(LockUnavailable):
        in_thread(lambda: lock.acquire(name, wait_ms=0))  # another owner: still held
    lock.release(name)
    assert not redis_client.exists(keys.lock(name))
    other = in_thread(lambda: (lock.acquire(name, wait_ms=0), lock.release(name))[0])
    assert other.fence > first.fence  # every new owner gets a larger token


def test_unlock_by_a_non_owner_is_refused(name, redis_client):
    lock = make_lock()
    lock.acquire(name)
    with pytest.raises(NotLockOwner):
        in_thread(lambda: lock.release(name))
    with pytest.raises(NotLockOwner):
        make_lock().release(name)  # another process
    assert redis_client.hget(keys.lock(name), lock.owner()) == b"1"
    lock.release(name)


def test_twenty_workers_incrementing_a_db_counter_lose_no_update(name, settings, sql):
    sql("CREATE TABLE IF NOT EXISTS t_lock_counter (name VARCHAR(64) PRIMARY KEY, value INT NOT NULL)")
    sql("INSERT INTO t_lock_counter VALUES (%s, 0)", (name,))
    lock = make_lock(wait_ms=30_000)

    def worker():
        conn = pymysql.connect(
            host=settings.db_host,
            port=settings.db_port,
            user=settings.db_user,
            password=settings.db_password,
            database=settings.db_name,
            autocommit=True,
        )
        with conn.cursor() as cur:
            for _ in range(10):
                with lock.hold(name):  # read, think, write: a lost update without the lock
                    cur.execute("SELECT value FROM t_lock_counter WHERE name = %s", (name,))
                    value = cur.fetchone()[0]
                    time.sleep(0.001)
                    cur.execute("UPDATE t_lock_counter SET value = %s WHERE name = %s", (value + 1, name))
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sql("SELECT value FROM t_lock_counter WHERE name = %s", (name,)) == ((200,),)


def test_a_waiter_sleeps_on_the_release_message_instead_of_spinning(name):
    holder, waiter = make_lock(), make_lock(wait_ms=5000)  # two processes' worth of locks
    holder.acquire(name)
    started, waited = time.monotonic(), {}

    def wait():
        waited["holding"] = waiter.acquire(name)
        waited["s"] = time.monotonic() - started
        waiter.release(name)  # from the acquiring thread: the owner is the thread

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.4)
    holder.release(name)
    t.join()
    assert waited["holding"] and 0.35 < waited["s"] < 2
    assert waiter.commands <= 4  # try, subscribe, try, and one try after the release message: no polling


def test_wait_timeout_gives_up(name):
    holder, waiter = make_lock(), make_lock(wait_ms=300)
    holder.acquire(name)
    started = time.monotonic()
    with pytest.raises(LockUnavailable):
        waiter.acquire(name)
    assert 0.25 < time.monotonic() - started < 2
    holder.release(name)


def test_watchdog_renews_while_held_and_stops_on_unlock(name, redis_client):
    lock = make_lock(lease_ms=300)
    lock.acquire(name)
    time.sleep(1.0)  # three leases
    assert redis_client.exists(keys.lock(name)) and lock.watchdog.watching() == [name]
    lock.release(name)
    assert lock.watchdog.watching() == [] and not redis_client.exists(keys.lock(name))


def test_watchdog_forgets_a_lock_whose_release_could_not_reach_redis(name, redis_client, monkeypatch):
    """Redisson #7272: the watchdog kept renewing after a failed unlock, so the lock never expired."""
    lock = make_lock(lease_ms=300)
    lock.acquire(name)

    def redis_gone(*_):
        raise RedisOutcomeUnknown("ConnectionError: gone")

    monkeypatch.setattr("hotledger.dal.lock.lock_release", redis_gone)
    with pytest.raises(RedisUnavailable):
        lock.release(name)
    assert lock.watchdog.watching() == []
    time.sleep(0.6)
    assert not redis_client.exists(keys.lock(name))  # the lease ran out by itself


def test_a_failed_renewal_is_reported_to_the_owner(name, redis_client):
    """Redisson #4698: the owner learns that its lock is gone."""
    reported = []
    lock = make_lock(lease_ms=300, on_lost=reported.append)
    holding = lock.acquire(name)
    redis_client.delete(keys.lock(name))  # e.g. a failover lost it
    assert holding.lost.wait(2) and [h.name for h in reported] == [name]
    with pytest.raises(Exception, match="ran out"):
        holding.ensure_held()


def test_redis_unreachable_is_a_clear_error_not_an_unlocked_run(name):
    dead = redis.Redis(port=1, socket_connect_timeout=0.2)
    lock = DistributedLock(Lua(dead, str(REPO / "layers" / "lua")), 5000, 500)
    with pytest.raises(LockUnavailable), lock.hold(name):
        pytest.fail("ran without the lock")


_PAUSED_OWNER = """
import sys, time
from pathlib import Path
from hotledger import errors, keys
from hotledger.ledger.feature import ledger
from hotledger.runtime import lock
user_id, out = int(sys.argv[1]), Path(sys.argv[2])
holding = lock().acquire(keys.account_lock(user_id))
out.with_suffix(".held").write_text(str(holding.fence))
while not out.with_suffix(".go").exists():
    time.sleep(0.01)
try:
    with ledger().store.transaction() as tx:
        tx.lock_account(user_id, holding.fence, holding.owner)
        tx.cursor.execute("UPDATE t_account SET balance = 0 WHERE user_id = %s", (user_id,))
    out.write_text("written")
except errors.FencedOut:
    out.write_text("refused lost=%s" % holding.lost.is_set())
"""


def test_an_owner_paused_past_its_lease_cannot_write_after_the_next_owner(api, sql, tmp_path):
    """A real SIGSTOP pauses the lock owner (its watchdog too) past the lease; an operator's change of the account
    takes the lock and writes (a SYNC charge takes the row lock alone: test_sync_row_lock.py); the old owner resumes
    and its fenced write is refused."""
    user_id = api.account(deduct_type="SYNC", balance="10.00")
    out = tmp_path / "owner"
    child = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_OWNER, str(user_id), str(out)],
        cwd=REPO,
        env={**os.environ, "LOCK_TTL_MS": "500", "PYTHONPATH": f"{REPO / 'functions'}:{REPO}"},
    )
    try:
        deadline = time.monotonic() + 30
        while not out.with_suffix(".held").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        old_fence = int(out.with_suffix(".held").read_text())
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.8)  # past the 500 ms lease: nobody renews it
        status, body = api("PATCH", f"/accounts/{user_id}", {"threshold": "1.00"})
        assert status == 200 and body["balance"] == "10.00"
        assert sql("SELECT fence FROM t_account WHERE user_id = %s", (user_id,))[0][0] > old_fence
        os.kill(child.pid, signal.SIGCONT)
        out.with_suffix(".go").write_text("")
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert out.read_text().startswith("refused")
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1000,),)


def test_fencing_tokens_only_grow_across_a_redis_flushall_on_a_sync_account(api, sql, redis_client):
    """Issue 10 item 15: the fence counter lived only in Redis; after a loss it restarted at 1 and every SYNC write
    on an account whose stored fence was higher was refused LOCK_LOST (seen: tokens 1, 2, 3, FLUSHALL, 1). The
    writes under the account lock here: the cache load after the loss, an operator's changes."""
    from hotledger import runtime

    user_id = api.account(deduct_type="SYNC", balance="10.00")
    for _ in range(3):
        assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
    before = sql("SELECT fence FROM t_account WHERE user_id = %s", (user_id,))[0][0]
    assert before > 0
    redis_client.flushall()  # a real loss of every key, the fence counter included
    runtime.reset()  # another process, which has not charged the account: its charge loads the cache, under the lock
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert (status, body.get("balance")) == (200, "6.00"), body
    after = sql("SELECT fence FROM t_account WHERE user_id = %s", (user_id,))[0][0]
    assert after > before
    for _ in range(2):  # and the tokens keep rising after the reseed, with every new owner
        assert api("PATCH", f"/accounts/{user_id}", {"threshold": "0.00"})[0] == 200
        fence, balance = sql("SELECT fence, balance FROM t_account WHERE user_id = %s", (user_id,))[0]
        assert fence > after
        after = fence
    assert balance == 600


_DEAD_WAITER = """
import sys
from hotledger.runtime import lock
print("waiting", flush=True)
lock().acquire(sys.argv[1], wait_ms=20_000)  # gives up before the live waiter below: first in line
"""


def test_a_release_wakes_the_next_live_waiter_not_a_dead_first_one(name, redis_client):
    """Issue 10 item 15: a waiter killed while queued stayed first in line until its give-up time; a release woke
    only it, and the live waiters slept on until the holder's lease would have ended."""
    from hotledger import keys

    holder = make_lock(lease_ms=20_000)
    holder.acquire(name)
    child = subprocess.Popen(
        [sys.executable, "-c", _DEAD_WAITER, name],
        cwd=REPO,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'functions'}:{REPO}"},
    )
    try:
        deadline = time.monotonic() + 30
        while redis_client.zcard(keys.lock_waiters(name)) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert redis_client.zcard(keys.lock_waiters(name)) == 1
    finally:
        child.kill()  # SIGKILL: it dies queued, first in line
        child.wait(10)
    died = time.monotonic()
    waiter, got = make_lock(wait_ms=30_000, waiter_liveness_ms=600), {}

    def wait():
        got["holding"] = waiter.acquire(name)
        got["at"] = time.monotonic()
        waiter.release(name)

    t = threading.Thread(target=wait)
    t.start()
    # the dead waiter's place in line lapses (default 3 s window, no refresh); the live one keeps refreshing its own
    time.sleep(max(0.0, died + 3.3 - time.monotonic()))
    released = time.monotonic()
    holder.release(name)
    t.join(30)
    assert got["holding"] and got["at"] - released < 0.25  # woken by the release, not by its own refresh


# fences only grow (issue 19, item 9) ------------------------------------------------------------------------------
def test_a_fence_handed_out_again_after_a_failover_is_refused_by_the_db_and_the_next_is_higher(api, redis_client):
    """A promoted replica that missed the last acquisition (the lock hash and the counter's last INCR) handed the same
    fence to the next owner, and the DB (t_account.fence) accepted an equal fence from another holder: both wrote."""
    from hotledger import errors, keys
    from hotledger.ledger.feature import ledger_store

    user = api.account(balance="10.00", deduct_type="SYNC")
    name = keys.account_lock(user)
    first = make_lock()
    holding = first.acquire(name)
    with ledger_store().transaction() as tx:
        tx.lock_account(user, holding.fence, holding.owner)  # the DB has seen this fence from this holder
    # the failover: the lock is free again and the counter one behind, as the replica last saw them
    redis_client.delete(keys.lock(name))
    redis_client.set(keys.lock_fence(name), holding.fence - 1)
    second = make_lock()
    other = second.acquire(name)
    assert other.owner != holding.owner and other.fence > holding.fence  # the fence rose all the same
    # and had it not: an equal fence from another holder is refused
    with ledger_store().transaction() as tx, pytest.raises(errors.FencedOut):
        tx.lock_account(user, holding.fence, other.owner)
    with ledger_store().transaction() as tx:  # the same holder's own fence is its own
        assert tx.lock_account(user, holding.fence, holding.owner) is not None
    second.release(name)
    first.watchdog.forget(name, holding.owner)


def test_tokens_rise_past_a_counter_ahead_of_the_clock(name, redis_client):
    """The counter may be ahead of Redis's clock (a clock stepped back, or many owners within a millisecond): each
    new owner still gets the counter + 1."""
    from hotledger import keys

    redis_client.set(
        keys.lock_fence(name), 5 * 10**15
    )  # ahead of the clock part (about 1.8e15 now), exact in a Lua double
    lock = make_lock()
    fences = []
    for _ in range(2):
        fences.append(lock.acquire(name).fence)
        lock.release(name)
    assert fences == [5 * 10**15 + 1, 5 * 10**15 + 2]
