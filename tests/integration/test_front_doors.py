"""Both front doors (template.yaml, FrontDoor) through the real handler: the HTTP API's payload v2 events behind its
JWT authorizer (the claims API Gateway verified, as text) and the REST API's v1 events behind the Lambda authorizer
answer alike, and callers act only as themselves in both."""

import json

import pytest

from helpers import Api
from infra import dev_issuer
from infra.localrt import events

IDS = {"order_id", "pay_id", "user_id"}


def _without_ids(body: dict) -> dict:
    return {k: "<id>" if k in IDS else v for k, v in body.items()}


def test_a_charge_answers_alike_through_either_front_door(api):
    answers = {}
    for front_door in ("rest", "http"):
        caller = Api(front_door=front_door)
        user_id = caller.account(balance="10.00")
        charged = caller("POST", f"/accounts/{user_id}/deduct", {"amount": "1.25"}, {"Idempotency-Key": "fd-1"})
        again = caller("POST", f"/accounts/{user_id}/deduct", {"amount": "1.25"}, {"Idempotency-Key": "fd-1"})
        refused = caller("POST", f"/accounts/{user_id}/deduct", {"amount": "1.001"})
        missing = caller("GET", "/no-such-route")
        answers[front_door] = [(status, _without_ids(body)) for status, body in (charged, again, refused, missing)]
        assert charged == again and charged[1]["balance"] == "8.75"
    assert answers["http"] == answers["rest"]
    assert [status for status, _ in answers["http"]] == [200, 200, 422, 404]


def test_the_http_api_answer_is_in_its_own_format(api):
    user_id = api.account(balance="1.00")
    caller = Api(front_door="http")
    for path in (f"/accounts/{user_id}/deduct", f"/accounts/{user_id}/nothing"):  # the lane's answer, the resolver's
        response = caller.handler(caller.event("POST", path, '{"amount": "0.01"}'), events.LambdaContext("ApiFunction"))
        assert "multiValueHeaders" not in response and response["headers"]["Content-Type"] == "application/json"


def test_behind_the_http_api_an_end_user_acts_only_as_themselves_and_nothing_changes(api):
    own, other = api.account(balance="5.00"), api.account(balance="5.00")
    user = Api(user_id=own, scopes=(), front_door="http")
    assert user("GET", f"/accounts/{own}")[0] == 200
    status, body = user("GET", f"/accounts/{other}")
    assert status == 403 and body["error"]["code"] == "FORBIDDEN"
    status, body = user("POST", f"/accounts/{own}/recharge", {"amount": "100.00"})  # users cannot mint money
    assert status == 403 and body["error"]["code"] == "FORBIDDEN"
    status, body = Api(anonymous=True, front_door="http")("POST", f"/accounts/{own}/deduct", {"amount": "1.00"})
    assert status == 401 and body["error"]["code"] == "UNAUTHENTICATED"
    assert [api("GET", f"/accounts/{u}")[1]["balance"] for u in (own, other)] == ["5.00", "5.00"]


def _call_with_claims(claims: dict, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    from api.app import handler

    event = events.api_gateway_http(
        method, path, json.dumps(body) if body else None, {"Content-Type": "application/json"}, jwt=claims
    )
    response = handler(event, events.LambdaContext("ApiFunction"))
    return response["statusCode"], json.loads(response["body"])


def test_the_operators_group_as_the_jwt_authorizer_passes_it_counts_as_the_admin_scope(api):
    operator = dev_issuer.jwt_authorizer_context(None, (), groups=("ops", "admin"))
    assert operator["claims"]["cognito:groups"] == "[ops admin]"
    status, body = _call_with_claims(operator, "POST", "/accounts", {"user_name": "made-by-an-operator"})
    assert status == 201, body
    nobody = dev_issuer.jwt_authorizer_context(None, (), groups=("ops",))
    status, body = _call_with_claims(nobody, "POST", "/accounts", {"user_name": "made-by-nobody"})
    assert status == 403 and body["error"]["code"] == "FORBIDDEN"


@pytest.mark.parametrize("token_use", ["refresh", ""])
def test_verified_claims_of_a_token_that_is_not_an_access_or_id_token_name_no_caller(api, token_use):
    user_id = api.account(balance="5.00")
    claims = dev_issuer.jwt_authorizer_context(None, ("service",), token_use=token_use)
    status, body = _call_with_claims(claims, "POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert status == 401 and body["error"]["code"] == "UNAUTHENTICATED"
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "5.00"


def test_an_id_token_names_its_user_by_cognito_username(api):
    own = api.account(balance="5.00")
    claims = dev_issuer.jwt_authorizer_context(
        own, (), token_use="id", aud=dev_issuer.CLIENT_ID, **{"cognito:username": str(own)}
    )
    assert _call_with_claims(claims, "GET", f"/accounts/{own}")[0] == 200
