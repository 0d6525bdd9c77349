"""The hot lane (api/hot_lane.py) answers exactly as the resolver does: the same requests, on two accounts in the same
state, one through the handler as it is and one with the lane switched off, get the same answers field for field
(ids aside); the lane took the plain ones, and everything it left went to the resolver."""

import json

import pytest

from helpers import Api
from infra.localrt import events

MISSING = 2**31 - 1
KEY = {"Idempotency-Key": "lane-key-1"}

# (method, path below the account, body, headers, raw body); run in order on a fresh account holding 10.00
SEQUENCE = [
    ("POST", "deduct", {"amount": "1.00"}, None, None),
    ("POST", "recharge", {"amount": "2.50"}, None, None),
    ("POST", "deduct", {"amount": "0.10"}, KEY, None),
    ("POST", "deduct", {"amount": "0.10"}, KEY, None),  # the replay: the first answer again
    ("POST", "deduct", {"amount": "0.20"}, KEY, None),  # the key with another body: 409
    ("POST", "deduct", {"amount": "1000.00"}, None, None),  # 402
    ("POST", "deduct", {"amount": "1.0001"}, None, None),  # 422 INVALID_AMOUNT: no amount has 4 digits
    ("POST", "deduct", {"amount": "1.001"}, None, None),  # 422 INVALID_AMOUNT: the account's USD has 2 (the route's)
    ("POST", "deduct", {}, None, None),  # 422 MISSING_FIELD
    ("POST", "deduct", None, None, "{not json"),  # 400
    ("POST", "deduct", {"amount": "1.00"}, {"Content-Type": "text/plain"}, None),  # 415
    ("POST", "deduct", {"amount": "1.00"}, {"Idempotency-Key": "x" * 300}, None),  # 422
    ("POST", "recharge", {"amount": "-1.00"}, None, None),
    ("POST", "deduct", {"amount": "11.40"}, None, None),  # the balance to 0: the API closes
    ("POST", "deduct", {"amount": "0.01"}, None, None),  # 403 API_CLOSED
    ("GET", "deduct", None, None, None),  # 405
]
ID_FIELDS = {"order_id", "pay_id", "entry_id", "user_id"}


def _answers(api, user_id: int, calls, lane_counts=None) -> list:
    """Each call's (status, the whole answer with ids left out, whether the lane answered it: with lane_counts)."""
    found = []
    for method, tail, body, headers, raw in calls:
        before = lane_counts["answered"] if lane_counts else 0
        text = raw if raw is not None else (json.dumps(body) if body is not None else None)
        response = api.handler(
            api.event(method, f"/accounts/{user_id}/{tail}", text, headers), events.LambdaContext("ApiFunction")
        )
        answer = {**response, "body": _without_ids(json.loads(response["body"]))}
        found.append((response["statusCode"], answer, lane_counts["answered"] > before if lane_counts else None))
    return found


def _without_ids(node):
    if isinstance(node, dict):
        return {k: "<id>" if k in ID_FIELDS else _without_ids(v) for k, v in node.items()}
    return node


@pytest.fixture(params=["rest", "http"])
def front_door(request):
    return request.param


@pytest.fixture
def api(api, front_door):
    """The handler driven with the events of each front door (REST payload v1, HTTP API payload v2)."""
    return Api(front_door=front_door)


@pytest.fixture
def lane_counts(monkeypatch, front_door):
    """How many requests the front door's lane answered; `off()` switches it off."""
    from api import app

    lane = app._http_lane if front_door == "http" else app._rest_lane
    counts = {"answered": 0}
    answer = lane.answer

    def counted(event, context):
        response = answer(event, context)
        counts["answered"] += response is not None
        return response

    monkeypatch.setattr(lane, "answer", counted)
    counts["off"] = lambda: monkeypatch.setattr(lane, "answer", lambda event, context: None)
    return counts


def test_the_lane_answers_as_the_resolver_does(api, lane_counts):
    with_lane, without_lane = api.account(balance="10.00"), api.account(balance="10.00")
    lane_answers = _answers(api, with_lane, SEQUENCE, lane_counts)
    lane_counts["off"]()
    assert [answer[:2] for answer in _answers(api, without_lane, SEQUENCE)] == [answer[:2] for answer in lane_answers]
    assert [(status, by_lane) for status, _, by_lane in lane_answers] == [
        (200, True), (200, True), (200, True), (200, True),  # the charges and the replay
        (409, True), (402, True),  # refusals the route raised
        (422, False), (422, True), (422, False), (400, False), (415, False), (422, False), (422, False),  # invalid
        (200, True), (403, True), (405, False),
    ]  # fmt: skip


def test_the_lane_leaves_refused_callers_and_missing_accounts_as_the_resolver_answers_them(api, lane_counts):
    calls = [("POST", "deduct", {"amount": "1.00"}, None, None)]
    anonymous, end_user = Api(anonymous=True, front_door=api.front_door), Api(7, (), front_door=api.front_door)
    lane_answers = [_answers(caller, MISSING, calls, lane_counts)[0] for caller in (api, anonymous, end_user)]
    lane_counts["off"]()
    assert [_answers(caller, MISSING, calls)[0][:2] for caller in (api, anonymous, end_user)] == [
        answer[:2] for answer in lane_answers
    ]
    # the missing account: the route ran and said 404; the callers the rule refuses: the resolver
    assert [(status, by_lane) for status, _, by_lane in lane_answers] == [(404, True), (401, False), (403, False)]


def test_an_unhandled_failure_in_the_route_is_raised_as_the_resolver_raises_it(api, lane_counts, monkeypatch):
    from hotledger.ledger import routes

    user_id = api.account(balance="1.00")

    class Broken:
        def deduct(self, *args):
            raise RuntimeError("a defect")

    working = routes.ledger
    monkeypatch.setattr(routes, "ledger", lambda: Broken())
    with pytest.raises(RuntimeError, match="a defect"):
        api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"})  # through the lane
    lane_counts["off"]()
    with pytest.raises(RuntimeError, match="a defect"):
        api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"})
    monkeypatch.setattr(routes, "ledger", working)
    status, body = api("GET", f"/accounts/{user_id}")
    assert status == 200 and body["balance"] == "1.00"
