"""The API's edge: requests the real Lambda handler refuses before any service is called, driven with API Gateway
REST proxy events and no server reachable. Every refusal answers the documented ErrorResponse shape."""
import io
import json
from contextlib import redirect_stdout

import pytest

from infra.localrt import events

AMOUNT_MESSAGE = '{field}: a decimal string with at most 2 fractional digits, such as "12.34", is required'


@pytest.fixture(autouse=True)
def no_service_is_called(monkeypatch):
    """Every service accessor the routers imported from hotledger.runtime fails the test if a route reaches it."""
    from api import accounts, notices, redpackets, vouchers

    def tripwire(name):
        def called(*args, **kwargs):
            raise AssertionError(f"the edge let the request through to hotledger.runtime.{name}()")
        return called

    for module in (accounts, vouchers, redpackets, notices):
        for name, value in list(vars(module).items()):
            if callable(value) and getattr(value, "__module__", None) == "hotledger.runtime":
                monkeypatch.setattr(module, name, tripwire(name))


def call(method: str, path: str, body=None, headers: dict | None = None, raw: str | None = None) -> tuple[int, dict, dict]:
    """Invoke the handler as Lambda does; returns (status, JSON body, headers)."""
    from api.app import handler

    text = raw if raw is not None else (json.dumps(body) if body is not None else None)
    event = events.api_gateway_proxy(method, path, text, {"Content-Type": "application/json", **(headers or {})})
    with redirect_stdout(io.StringIO()):  # the EMF metrics line
        response = handler(event, events.LambdaContext("ApiFunction"))
    return int(response["statusCode"]), json.loads(response["body"]), dict(response.get("multiValueHeaders") or {})


def assert_refused(answer: tuple[int, dict, dict], status: int, code: str, message: str | None = None) -> None:
    got_status, body, headers = answer
    assert (got_status, body["error"]["code"]) == (status, code), body
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert headers["Content-Type"] == ["application/json"]
    if message is not None:
        assert body["error"]["message"] == message


BAD_AMOUNTS = ["1.234", "-1", "-1.00", "1e3", 12.5, 12, "0", "0.00", "1000000000000.00", "", " 1.00", "+1.00", "01.00",
               "1,00", "NaN", "Infinity", None, True, ["1.00"]]


@pytest.mark.parametrize("amount", BAD_AMOUNTS, ids=repr)
@pytest.mark.parametrize("route", ["deduct", "recharge"])
def test_a_charge_with_a_bad_amount_is_refused(route, amount):
    answer = call("POST", f"/accounts/7/{route}", {"amount": amount})
    assert_refused(answer, 422, "INVALID_AMOUNT", AMOUNT_MESSAGE.format(field="amount"))


@pytest.mark.parametrize("method,path,body,field", [
    ("POST", "/accounts", {"user_name": "a", "threshold": "-1.00"}, "threshold"),
    ("POST", "/accounts", {"user_name": "a", "threshold": "0.001"}, "threshold"),
    ("PATCH", "/accounts/7", {"threshold": 1}, "threshold"),
    ("POST", "/redpackets", {"sender_id": 7, "total": "0.00", "count": 1}, "total"),
    ("POST", "/redpackets", {"sender_id": 7, "total": "1e2", "count": 1}, "total"),
    ("POST", "/orders", {"user_id": 7, "amount": "12.345", "close_in_s": 60}, "amount"),
])
def test_every_money_field_refuses_what_is_not_a_plain_amount(method, path, body, field):
    assert_refused(call(method, path, body), 422, "INVALID_AMOUNT", AMOUNT_MESSAGE.format(field=field))


@pytest.mark.parametrize("method,path,body,message", [
    ("POST", "/accounts/7/deduct", {}, "amount is required"),
    ("POST", "/accounts/7/recharge", {"amout": "1.00"}, "amount is required"),
    ("POST", "/accounts", {"deduct_type": "SYNC"}, "user_name is required"),
    ("POST", "/redpackets", {"sender_id": 7, "total": "1.00"}, "count is required"),
    ("POST", "/vouchers/5/orders", {}, "user_id is required"),
])
def test_a_missing_field_is_named(method, path, body, message):
    assert_refused(call(method, path, body), 422, "MISSING_FIELD", message)


def test_a_charge_without_a_body_is_a_missing_field():
    assert_refused(call("POST", "/accounts/7/deduct"), 422, "MISSING_FIELD")


@pytest.mark.parametrize("raw", ['{"amount": ', '{"amount": "1.00",}', "amount=1.00", "{'amount': '1.00'}"])
def test_a_body_that_is_not_json_is_400(raw):
    assert_refused(call("POST", "/accounts/7/deduct", raw=raw), 400, "MALFORMED_JSON", "the request body is not valid JSON")


@pytest.mark.filterwarnings("ignore:Received multipart/form-data without base64 encoding")
@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x"])
def test_a_body_sent_as_a_form_is_415(content_type):
    answer = call("POST", "/accounts/7/deduct", raw="amount=1.00", headers={"Content-Type": content_type})
    assert_refused(answer, 415, "UNSUPPORTED_MEDIA_TYPE", "send the body as JSON with Content-Type: application/json")


def test_a_body_sent_as_text_is_415():
    status, _, _ = call("POST", "/accounts/7/deduct", raw='{"amount": "1.00"}', headers={"Content-Type": "text/plain"})
    assert status == 415


def test_a_body_sent_as_text_gets_the_error_response_shape():
    answer = call("POST", "/accounts/7/deduct", raw='{"amount": "1.00"}', headers={"Content-Type": "text/plain"})
    assert_refused(answer, 415, "UNSUPPORTED_MEDIA_TYPE")


@pytest.mark.parametrize("method,path", [("GET", "/nope"), ("DELETE", "/accounts/7"), ("PUT", "/accounts/7/deduct"),
                                         ("GET", "/accounts/7/deduct"), ("POST", "/accounts/7/deduct/now")])
def test_an_unknown_route_is_404(method, path):
    assert_refused(call(method, path, {"amount": "1.00"}), 404, "ROUTE_NOT_FOUND", "no such route")


@pytest.mark.parametrize("method,path,body,message", [
    ("POST", "/accounts/7/deduct", {"amount": "1.00", "currency": "EUR"}, "currency: Extra inputs are not permitted"),
    ("POST", "/accounts", {"user_name": "a", "balance": "10.00"}, "balance: Extra inputs are not permitted"),
    ("PATCH", "/accounts/7", {"version": 3}, "version: Extra inputs are not permitted"),
])
def test_extra_fields_are_refused(method, path, body, message):
    assert_refused(call(method, path, body), 422, "VALIDATION_ERROR", message)


@pytest.mark.parametrize("method,path,field", [
    ("GET", "/accounts/0", "path.user_id"),
    ("GET", "/accounts/-3", "path.user_id"),
    ("GET", "/accounts/abc", "path.user_id"),
    ("GET", "/accounts/2147483648", "path.user_id"),
    ("POST", "/accounts/0/deduct", "path.user_id"),
    ("GET", "/accounts/7/orders/0", "path.order_id"),
    ("GET", "/accounts/7/orders/9223372036854775808", "path.order_id"),
    ("GET", "/vouchers/x1", "path.voucher_id"),
])
def test_bad_path_ids_are_refused(method, path, field):
    status, body, _ = call(method, path, {"amount": "1.00"} if method == "POST" else None)
    assert_refused((status, body, {"Content-Type": ["application/json"]}), 422, "VALIDATION_ERROR")
    assert body["error"]["message"].startswith(f"{field}: ")


@pytest.mark.parametrize("key", ["has space", "a/b", "", "k" * 101])
def test_a_bad_idempotency_key_is_refused(key):
    status, body, headers = call("POST", "/accounts/7/deduct", {"amount": "1.00"}, headers={"Idempotency-Key": key})
    assert_refused((status, body, headers), 422, "VALIDATION_ERROR")
    assert body["error"]["message"].startswith("header.idempotency-key: ")


@pytest.mark.parametrize("body,message", [
    ({"user_name": "a", "deduct_type": "FAST"}, "deduct_type: Input should be 'ASYNC' or 'SYNC'"),
    ({"user_name": "no spaces"}, "user_name: String should match pattern '^[A-Za-z0-9_.@-]+$'"),
    ({"user_name": 42}, "user_name: Input should be a valid string"),
])
def test_other_invalid_fields_are_validation_errors(body, message):
    assert_refused(call("POST", "/accounts", body), 422, "VALIDATION_ERROR", message)


def test_a_json_body_that_is_not_an_object_is_refused():
    assert_refused(call("POST", "/accounts/7/deduct", ["1.00"]), 422, "VALIDATION_ERROR")


def test_amounts_reach_the_route_as_minor_units():
    """The schema parses the decimal text once: what a route reads is already an int of minor units."""
    from api.schemas import AmountRequest, CreateAccountRequest, PatchAccountRequest

    assert AmountRequest.model_validate({"amount": "12.34"}).amount == 1234
    assert AmountRequest.model_validate({"amount": "7"}).amount == 700
    assert CreateAccountRequest.model_validate({"user_name": "a"}).threshold == 0
    assert CreateAccountRequest.model_validate({"user_name": "a", "threshold": "0.5"}).threshold == 50
    assert PatchAccountRequest.model_validate({}).threshold is None

