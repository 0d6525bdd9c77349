"""Idempotency-Keys of the money- and stock-moving routes (issue 10 item 3), through the API handler with fakes:
which answers become the key's answer (successes and business refusals), which give the key back (503s, crashes),
and that a replay, a conflict or a request in flight never reaches the service."""

import io
import json
from contextlib import redirect_stdout
from dataclasses import dataclass

import pytest

from helpers import caller_context
from hotledger import errors
from hotledger.dal.db import DatabaseUnavailable
from hotledger.dal.idempotency import BeginStatus, Begun
from hotledger.dal.redis_store import RedisOutcomeUnknown, RedisUnavailable
from infra.localrt import events


class FakeIdempotency:
    def __init__(self):
        self.records: dict[tuple[str, str], dict] = {}

    def begin(self, scope, key, fingerprint, durable=False):
        record = self.records.get((scope, key))
        if record is None:
            self.records[(scope, key)] = {"fp": fingerprint, "token": "t1", "answer": None}
            return Begun(BeginStatus.NEW, token="t1")
        if record["fp"] != fingerprint:
            return Begun(BeginStatus.CONFLICT)
        if record["answer"] is None:
            return Begun(BeginStatus.RUNNING)
        return Begun(BeginStatus.REPLAY, answer_status=record["answer"][0], body=record["answer"][1])

    def finish(self, scope, key, token, status, body, durable=False, fingerprint=""):
        self.records[(scope, key)]["answer"] = (status, body)
        return True

    def abandon(self, scope, key, token, durable=False):
        del self.records[(scope, key)]


@dataclass
class Grab:
    item_id: int
    user_id: int
    amount: int


class FakePackets:
    def __init__(self):
        self.grabs, self.fail_with = [], None

    def grab(self, packet_id, user_id):
        self.grabs.append(user_id)
        if self.fail_with is not None:
            raise self.fail_with
        return Grab(len(self.grabs), user_id, 100)

    def sender_of(self, packet_id):
        return 1


class FakeCurrencies:
    """Every account holds dollars."""

    def of(self, user_id):
        from hotledger.money import Currency

        return Currency.of("USD")


@pytest.fixture
def world(monkeypatch):
    from api import idempotency
    from hotledger.redpackets import routes as redpackets

    store, packets = FakeIdempotency(), FakePackets()
    monkeypatch.setattr(idempotency, "idempotency", lambda: store)
    monkeypatch.setattr(redpackets, "redpackets", lambda: packets)
    monkeypatch.setattr(redpackets, "currencies", FakeCurrencies)
    return store, packets


def grab(user_id=5, key="k1", packet_id=9):
    from api.app import handler

    headers = {"Content-Type": "application/json", **({"Idempotency-Key": key} if key else {})}
    event = events.api_gateway_proxy(
        "POST", f"/redpackets/{packet_id}/grab", json.dumps({"user_id": user_id}), headers, authorizer=caller_context()
    )
    with redirect_stdout(io.StringIO()):
        response = handler(event, events.LambdaContext("ApiFunction"))
    return int(response["statusCode"]), json.loads(response["body"])


def test_a_success_is_the_keys_answer_and_a_retry_never_reaches_the_service(world):
    store, packets = world
    first = grab()
    assert first[0] == 200 and grab() == first and packets.grabs == [5]
    assert list(store.records) == [("account:5", "k1")]  # scoped per acting account


def test_a_business_refusal_is_the_keys_answer(world):
    _store, packets = world
    packets.fail_with = errors.PacketEmpty("no item left")
    first = grab()
    assert first == (409, {"error": {"code": "EMPTY", "message": "no item left"}})
    packets.fail_with = None
    assert grab() == first and packets.grabs == [5]


@pytest.mark.parametrize(
    "failure",
    [
        errors.ServiceUnavailable("down"),
        errors.Recovering("loading"),
        RedisUnavailable("refused"),
        DatabaseUnavailable("down"),
    ],
)
def test_a_503_that_changed_nothing_gives_the_key_back(world, failure):
    store, packets = world
    packets.fail_with = failure
    assert grab()[0] == 503 and store.records == {}
    packets.fail_with = None
    assert grab()[0] == 200 and packets.grabs == [5, 5]


@pytest.mark.parametrize("failure", [RuntimeError("bug"), RedisOutcomeUnknown("timeout")])
def test_a_failure_that_may_come_after_an_effect_keeps_the_key_in_flight(world, failure):
    """Until its lease ends (then a retry takes it over: tests/integration/test_idempotency_keys.py)."""
    _store, packets = world
    packets.fail_with = failure
    if isinstance(failure, RedisOutcomeUnknown):
        assert grab()[0] == 503
    else:
        with pytest.raises(RuntimeError):  # the Lambda invocation fails
            grab()
    packets.fail_with = None
    status, body = grab()
    assert (status, body["error"]["code"]) == (409, "IDEMPOTENCY_IN_PROGRESS") and packets.grabs == [5]


def test_another_body_is_a_conflict_and_a_request_in_flight_is_refused(world):
    store, packets = world
    assert grab(packet_id=9)[0] == 200
    status, body = grab(packet_id=10)
    assert (status, body["error"]["code"]) == (409, "IDEMPOTENCY_KEY_REUSED")
    from api.idempotency import fingerprint

    store.records[("account:5", "k2")] = {
        "fp": fingerprint("POST /redpackets/9/grab", {"user_id": 5}),
        "token": "t0",
        "answer": None,
    }  # another attempt holds it
    status, body = grab(key="k2")
    assert (status, body["error"]["code"]) == (409, "IDEMPOTENCY_IN_PROGRESS") and packets.grabs == [5]


def test_without_a_key_nothing_is_recorded(world):
    store, _packets = world
    assert grab(key=None)[0] == 200 and store.records == {}


def test_an_outcome_unknown_is_the_keys_answer_so_a_retry_cannot_move_money_twice(world):
    _store, packets = world
    packets.fail_with = errors.ChargeOutcomeUnknown("the broker did not answer", entry_id="12")
    first = grab()
    assert first[0] == 503 and first[1]["error"]["code"] == "OUTCOME_UNKNOWN"
    packets.fail_with = None
    assert grab() == first and packets.grabs == [5]
