"""Ids never repeat (issue 10, item 12): two IdGenerators on one fake Redis and one fake clock; the first one's
worker-id lease is lost (Redis lost the key, or the holder was frozen past the lease) and the second one claims
the same worker id while the first still believes it holds it."""

from __future__ import annotations

import pytest

from hotledger import keys
from hotledger.dal import ids
from hotledger.dal.ids import EPOCH_MS, SEQUENCE_BITS, WORKER_BITS, IdGenerator


class Clock:
    """monotonic, time and sleep of the `time` module, advanced only by sleep() and by the test."""

    def __init__(self):
        self.now = EPOCH_MS / 1000 + 100_000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0005)


class FakeRedis:
    """SET NX PX, GET, INCR and DELETE over a dict, with expiry by the fake clock."""

    def __init__(self, clock: Clock):
        self.clock, self.data = clock, {}

    def _live(self, key):
        value, until = self.data.get(key, (None, None))
        if until is not None and self.clock.now * 1000 >= until:
            self.data.pop(key)
            return None
        return value

    def get(self, key):
        return self._live(key)

    def set(self, key, value, nx=False, px=None):
        if nx and self._live(key) is not None:
            return None
        self.data[key] = (value, None if px is None else self.clock.now * 1000 + px)
        return True

    def incr(self, key):
        value = int(self._live(key) or 0) + 1
        self.data[key] = (str(value), None)
        return value

    def delete(self, key):
        self.data.pop(key, None)


class FakeLua:
    """ids_lease.lua over FakeRedis."""

    def __init__(self, client: FakeRedis):
        self.client = client

    def run(self, name, keys_, args):
        assert name == "ids_lease"
        key, (token, action, lease_ms) = keys_[0], args
        if self.client.get(key) != token:
            return 0
        if action == "release":
            self.client.delete(key)
        else:
            self.client.data[key] = (token, self.client.clock.now * 1000 + int(lease_ms))
        return 1


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(ids, "time", fake)
    return fake


def worker_of(id_: int) -> int:
    return (id_ >> SEQUENCE_BITS) & ((1 << WORKER_BITS) - 1)


def steal(redis: FakeRedis, worker: int) -> None:
    """The next claim lands on `worker`."""
    redis.set(keys.IDGEN_WORKER_PREFIX + "next", str(worker - 1))


def interleave(a: IdGenerator, b: IdGenerator, clock: Clock, seconds: float, step: float = 0.0001) -> list[int]:
    issued = []
    end = clock.now + seconds
    while clock.now < end:
        issued += [a.next_id(), b.next_id()]
        clock.now += step
    return issued


def test_a_lease_lost_in_redis_and_taken_by_another_process_never_repeats_an_id(clock):
    """Before the fix: A kept issuing on its worker id for up to a second after Redis lost its lease key, B
    claimed the same id and issued at once: the same ids (same ms, worker, sequence) came out of both."""
    redis = FakeRedis(clock)
    a, b = IdGenerator(FakeLua(redis)), IdGenerator(FakeLua(redis))
    first = a.next_id()
    worker = worker_of(first)
    redis.delete(keys.IDGEN_WORKER_PREFIX + str(worker))  # failover: the lease key is gone
    steal(redis, worker)
    issued = [first, *interleave(a, b, clock, 2.0)]
    assert len(issued) == len(set(issued)), "an id was issued twice"
    assert worker_of(b.next_id()) == worker  # B did take A's worker id; A moved to another one
    assert worker_of(a.next_id()) != worker


def test_a_holder_frozen_past_its_lease_never_issues_the_next_holders_ids(clock):
    """A is frozen (its clocks stood still, as in a frozen Lambda sandbox whose monotonic clock did not move)
    past its lease; B takes the worker id; A resumes. A must not issue on the old lease."""
    redis = FakeRedis(clock)
    a = IdGenerator(FakeLua(redis), lease_ms=60_000)
    first = a.next_id()
    worker = worker_of(first)
    frozen_monotonic = clock.now
    clock.now += 61  # the lease expired while A was frozen
    steal(redis, worker)
    b = IdGenerator(FakeLua(redis), lease_ms=60_000)
    from_b = [b.next_id() for _ in range(3)]
    assert all(worker_of(i) == worker for i in from_b)
    # A resumes with a monotonic clock that did not move during the freeze (the wall clock did)
    monotonic = clock.monotonic
    clock.monotonic = lambda: frozen_monotonic + (clock.now - frozen_monotonic - 61)
    try:
        issued = [first, *from_b, *interleave(a, b, clock, 1.5)]
    finally:
        clock.monotonic = monotonic
    assert len(issued) == len(set(issued))
    assert worker_of(a.next_id()) != worker


def test_ids_grow_and_a_renewed_lease_issues_without_waiting(clock):
    redis = FakeRedis(clock)
    a = IdGenerator(FakeLua(redis))
    issued = []
    for _ in range(10_000):
        issued.append(a.next_id())
        clock.now += 0.00005
    assert issued == sorted(issued) and len(set(issued)) == len(issued)
    started = clock.now
    clock.now += 5  # long past the check interval: a renewal, no claim, no wait
    a.next_id()
    assert clock.now - started < 5.01


class SlowOnce(FakeLua):
    """The first renewal answers after `delay_s` (a loaded host, a slow network round trip); the others at once."""

    def __init__(self, client: FakeRedis, delay_s: float):
        super().__init__(client)
        self.delay_s, self.renewals = delay_s, 0

    def run(self, name, keys_, args):
        answer = super().run(name, keys_, args)
        if args[1] == "renew":
            self.renewals += 1
            if self.renewals == 1:
                self.client.clock.now += self.delay_s
        return answer


def test_one_renewal_answered_too_late_is_renewed_again_not_answered_503(clock):
    """Seen in the flash-sale e2e on a loaded machine: one renewal answered after its window, and the request got 503
    SERVICE_UNAVAILABLE although the lease was still ours. A late answer proves only that this window is gone: renew
    again (bounded), then issue."""
    redis = FakeRedis(clock)
    lua = SlowOnce(redis, delay_s=ids.VALID_S + 0.1)
    a = IdGenerator(lua)
    a.next_id()  # claims, waits, renews (late), renews again
    assert lua.renewals == 2


def test_renewals_that_keep_answering_too_late_refuse_to_issue(clock):
    class AlwaysSlow(FakeLua):
        def run(self, name, keys_, args):
            answer = super().run(name, keys_, args)
            if args[1] == "renew":
                self.client.clock.now += ids.VALID_S + 0.1
            return answer

    a = IdGenerator(AlwaysSlow(FakeRedis(clock)))
    with pytest.raises(ids.RedisUnavailable, match="too late"):
        a.next_id()
