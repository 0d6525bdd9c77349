"""Above dal and the stores a Redis failure is RedisUnavailable (nothing ran) or RedisOutcomeUnknown (it may have
run): the translation every store relies on."""

import pytest
import redis

from hotledger.dal.redis_store import (
    RedisCommandError,
    RedisOutcomeUnknown,
    RedisUnavailable,
    redis_errors_translated,
    translate,
)


def _refused() -> redis.ConnectionError:
    """What redis-py raises when connect() was refused: the socket error is its context."""
    error = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    error.__context__ = ConnectionRefusedError(111, "Connection refused")
    return error


def test_a_refused_connection_means_nothing_ran():
    error = translate(_refused())
    assert type(error) is RedisUnavailable


@pytest.mark.parametrize(
    "lost", [redis.TimeoutError("Timeout reading from socket"), redis.ConnectionError("Connection closed by server.")]
)
def test_a_lost_answer_means_the_command_may_have_run(lost):
    assert type(translate(lost)) is RedisOutcomeUnknown


def test_a_script_error_ran_and_is_not_called_unavailable_only():
    error = translate(redis.ResponseError("ERR user_script:1: bad argument"))
    assert type(error) is RedisCommandError and isinstance(error, RedisOutcomeUnknown)


def test_every_public_method_of_a_store_is_translated_static_ones_included():
    @redis_errors_translated
    class Store:
        def read(self):
            raise redis.TimeoutError("slow")

        @staticmethod
        def write(value):
            raise _refused()

        @classmethod
        def build(cls):
            return cls

        def _private(self):
            raise redis.TimeoutError("kept as it is")

    with pytest.raises(RedisOutcomeUnknown):
        Store().read()
    with pytest.raises(RedisUnavailable) as refused:
        Store.write(1)
    assert type(refused.value) is RedisUnavailable
    assert Store.build() is Store
    with pytest.raises(redis.TimeoutError):
        Store()._private()


def test_a_method_whose_scripts_translate_their_own_errors_is_left_as_it_is():
    from hotledger.dal.redis_store import scripts_only

    @redis_errors_translated
    class Store:
        @scripts_only
        def run(self):
            raise redis.TimeoutError("slow")  # what Lua.run never lets out

        def read(self):
            raise redis.TimeoutError("slow")

    with pytest.raises(redis.TimeoutError):
        Store().run()
    with pytest.raises(RedisOutcomeUnknown):
        Store().read()
