"""The decision "nothing changed" vs "outcome unknown" over every redis-py attempt (issue 10, item 4), with fake
attempts: no server."""

from __future__ import annotations

import pytest
import redis
from redis.backoff import NoBackoff

from hotledger.config import Settings
from hotledger.dal.redis_store import (
    RETRY_HORIZON_S,
    AttemptsKept,
    RedisOutcomeUnknown,
    RedisUnavailable,
    connect,
    translate,
)


def refused() -> redis.ConnectionError:
    """What redis-py raises when connect() meets a closed port: a ConnectionError raised from ConnectionRefusedError."""
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as exc:
            raise redis.ConnectionError("Error 111 connecting. Connection refused.") from exc
    except redis.ConnectionError as exc:
        return exc


def timed_out() -> redis.TimeoutError:
    return redis.TimeoutError("Timeout reading from socket")


def dropped() -> redis.ConnectionError:
    return redis.ConnectionError("Connection closed by server.")


def outcome(*attempts: Exception):
    """Run one call whose attempts fail in turn with these errors (or answer 'ok' once they are used up)."""
    left = list(attempts)

    def do():
        if left:
            raise left.pop(0)
        return "ok"

    try:
        return AttemptsKept(NoBackoff(), 2).call_with_retry(do, lambda error, failures=0: None)
    except redis.RedisError as exc:
        return translate(exc)


@pytest.mark.parametrize("first", [timed_out, dropped])
def test_an_attempt_that_may_have_run_makes_the_outcome_unknown_whatever_the_resends_met(first):
    result = outcome(first(), refused(), refused())
    assert isinstance(result, RedisOutcomeUnknown)


def test_a_later_attempt_that_may_have_run_counts_too():
    assert isinstance(outcome(refused(), timed_out(), refused()), RedisOutcomeUnknown)


def test_only_refusals_mean_nothing_changed():
    result = outcome(refused(), refused(), refused())
    assert isinstance(result, RedisUnavailable) and not isinstance(result, RedisOutcomeUnknown)


def test_an_answer_after_failed_attempts_is_the_answer():
    assert outcome(timed_out(), refused()) == "ok"


def test_an_error_raised_outside_any_retry_is_judged_alone():
    assert not isinstance(translate(refused()), RedisOutcomeUnknown)
    assert isinstance(translate(timed_out()), RedisOutcomeUnknown)


def test_the_client_keeps_every_attempt_and_its_retry_horizon_is_bounded():
    client = connect(Settings(redis_url="redis://127.0.0.1:1/0"))
    retry = client.connection_pool.connection_kwargs["retry"]
    assert isinstance(retry, AttemptsKept) and retry.get_retries() == 2
    assert 0 < RETRY_HORIZON_S < 30
