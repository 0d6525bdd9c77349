"""The API's edge: requests the real Lambda handler refuses before any service is called, driven with API Gateway
REST proxy events and no server reachable. Every refusal answers the documented ErrorResponse shape."""

import io
import json
from contextlib import redirect_stdout

import pytest

from helpers import caller_context
from infra.localrt import events

AMOUNT_MESSAGE = (
    "{field}: a decimal string with at most as many fractional digits as the account's currency has (JPY 0, USD 2, KWD"
    ' 3), such as "12.34", is required'
)


@pytest.fixture(autouse=True)
def no_service_is_called(monkeypatch):
    """Every service accessor the routers imported (from hotledger.runtime or a feature.py) fails the test if a route
    reaches it."""
    import importlib

    from hotledger.features import registered

    def tripwire(name):
        def called(*args, **kwargs):
            raise AssertionError(f"the edge let the request through to the service {name}()")

        return called

    for module in (importlib.import_module(feature.routes) for feature in registered() if feature.routes):
        for name, value in list(vars(module).items()):
            home = getattr(value, "__module__", None) or ""
            if callable(value) and (home == "hotledger.runtime" or home.endswith(".feature")):
                monkeypatch.setattr(module, name, tripwire(name))


def call(
    method: str, path: str, body=None, headers: dict | None = None, raw: str | None = None
) -> tuple[int, dict, dict]:
    """Invoke the handler as Lambda does; returns (status, JSON body, headers)."""
    from api.app import handler

    text = raw if raw is not None else (json.dumps(body) if body is not None else None)
    event = events.api_gateway_proxy(
        method, path, text, {"Content-Type": "application/json", **(headers or {})}, authorizer=caller_context()
    )
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


BAD_AMOUNTS = [
    "1.2345",  # more than any currency has (1.234: the account's currency decides, tests/integration/test_currencies.py)
    "-1",
    "-1.00",
    "1e3",
    12.5,
    12,
    "0",
    "0.00",
    "1000000000000.00",
    "",
    " 1.00",
    "+1.00",
    "01.00",
    "1,00",
    "NaN",
    "Infinity",
    None,
    True,
    ["1.00"],
]


@pytest.mark.parametrize("amount", BAD_AMOUNTS, ids=repr)
@pytest.mark.parametrize("route", ["deduct", "recharge"])
def test_a_charge_with_a_bad_amount_is_refused(route, amount):
    answer = call("POST", f"/accounts/7/{route}", {"amount": amount})
    assert_refused(answer, 422, "INVALID_AMOUNT", AMOUNT_MESSAGE.format(field="amount"))


@pytest.mark.parametrize(
    "method,path,body,field",
    [
        ("POST", "/accounts", {"user_name": "a", "threshold": "-1.00"}, "threshold"),
        ("POST", "/accounts", {"user_name": "a", "threshold": "0.0001"}, "threshold"),
        ("PATCH", "/accounts/7", {"threshold": 1}, "threshold"),
        ("POST", "/redpackets", {"sender_id": 7, "total": "0.00", "count": 1}, "total"),
        ("POST", "/redpackets", {"sender_id": 7, "total": "1e2", "count": 1}, "total"),
        ("POST", "/orders", {"user_id": 7, "amount": "12.3456", "close_in_s": 60}, "amount"),
    ],
)
def test_every_money_field_refuses_what_is_not_a_plain_amount(method, path, body, field):
    assert_refused(call(method, path, body), 422, "INVALID_AMOUNT", AMOUNT_MESSAGE.format(field=field))


@pytest.mark.parametrize(
    "method,path,body,message",
    [
        ("POST", "/accounts/7/deduct", {}, "amount is required"),
        ("POST", "/accounts/7/recharge", {"amout": "1.00"}, "amount is required"),
        ("POST", "/accounts", {"deduct_type": "SYNC"}, "user_name is required"),
        ("POST", "/redpackets", {"sender_id": 7, "total": "1.00"}, "count is required"),
        ("POST", "/vouchers/5/orders", {}, "user_id is required"),
    ],
)
def test_a_missing_field_is_named(method, path, body, message):
    assert_refused(call(method, path, body), 422, "MISSING_FIELD", message)


def test_a_charge_without_a_body_is_a_missing_field():
    assert_refused(call("POST", "/accounts/7/deduct"), 422, "MISSING_FIELD")


@pytest.mark.parametrize("raw", ['{"amount": ', '{"amount": "1.00",}', "amount=1.00", "{'amount': '1.00'}"])
def test_a_body_that_is_not_json_is_400(raw):
    assert_refused(
        call("POST", "/accounts/7/deduct", raw=raw), 400, "MALFORMED_JSON", "the request body is not valid JSON"
    )


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


@pytest.mark.parametrize("method,path", [("GET", "/nope"), ("POST", "/accounts/7/deduct/now")])
def test_an_unknown_route_is_404(method, path):
    assert_refused(call(method, path, {"amount": "1.00"}), 404, "ROUTE_NOT_FOUND", "no such route")


@pytest.mark.parametrize(
    "method,path,allow",
    [
        ("DELETE", "/accounts/7", "GET, PATCH"),
        ("PUT", "/accounts/7/deduct", "POST"),
        ("GET", "/accounts/7/deduct", "POST"),
        ("PUT", "/accounts", "POST"),
    ],
)
def test_an_undeclared_method_of_a_route_is_405_with_the_routes_methods(method, path, allow):
    """Issue 19 item 13: a route that exists answers 405 with an Allow header for a method it does not declare."""
    answer = call(method, path, {"amount": "1.00"})
    assert_refused(answer, 405, "METHOD_NOT_ALLOWED")
    assert answer[2]["Allow"] == [allow], answer


@pytest.mark.parametrize(
    "method,path,body,message",
    [
        (
            "POST",
            "/accounts/7/deduct",
            {"amount": "1.00", "currency": "EUR"},
            "currency: Extra inputs are not permitted",
        ),
        ("POST", "/accounts", {"user_name": "a", "balance": "10.00"}, "balance: Extra inputs are not permitted"),
        ("PATCH", "/accounts/7", {"version": 3}, "version: Extra inputs are not permitted"),
    ],
)
def test_extra_fields_are_refused(method, path, body, message):
    assert_refused(call(method, path, body), 422, "VALIDATION_ERROR", message)


@pytest.mark.parametrize(
    "method,path,field",
    [
        ("GET", "/accounts/0", "path.user_id"),
        ("GET", "/accounts/-3", "path.user_id"),
        ("GET", "/accounts/abc", "path.user_id"),
        ("GET", "/accounts/2147483648", "path.user_id"),
        ("POST", "/accounts/0/deduct", "path.user_id"),
        ("GET", "/accounts/7/orders/0", "path.order_id"),
        ("GET", "/accounts/7/orders/9223372036854775808", "path.order_id"),
        ("GET", "/vouchers/x1", "path.voucher_id"),
    ],
)
def test_bad_path_ids_are_refused(method, path, field):
    status, body, _ = call(method, path, {"amount": "1.00"} if method == "POST" else None)
    assert_refused((status, body, {"Content-Type": ["application/json"]}), 422, "VALIDATION_ERROR")
    assert body["error"]["message"].startswith(f"{field}: ")


@pytest.mark.parametrize("key", ["has space", "a/b", "", "k" * 101])
def test_a_bad_idempotency_key_is_refused(key):
    status, body, headers = call("POST", "/accounts/7/deduct", {"amount": "1.00"}, headers={"Idempotency-Key": key})
    assert_refused((status, body, headers), 422, "VALIDATION_ERROR")
    assert body["error"]["message"].startswith("header.idempotency-key: ")


@pytest.mark.parametrize(
    "body,message",
    [
        ({"user_name": "a", "deduct_type": "FAST"}, "deduct_type: Input should be 'ASYNC' or 'SYNC'"),
        ({"user_name": "no spaces"}, "user_name: String should match pattern '^[A-Za-z0-9_.@-]+$'"),
        ({"user_name": 42}, "user_name: Input should be a valid string"),
    ],
)
def test_other_invalid_fields_are_validation_errors(body, message):
    assert_refused(call("POST", "/accounts", body), 422, "VALIDATION_ERROR", message)


def test_a_json_body_that_is_not_an_object_is_refused():
    assert_refused(call("POST", "/accounts/7/deduct", ["1.00"]), 422, "VALIDATION_ERROR")


def test_amounts_reach_the_route_as_exact_decimals():
    """The schema checks the decimal text's form once: what a route reads is an exact Decimal (its digits kept), which
    the account's currency turns into minor units (hotledger.currencies); an Idempotency-Key's fingerprint takes it
    by value, as the cents it was before currencies when it has at most 2 digits."""
    from decimal import Decimal

    from api.schemas import AmountRequest, CreateAccountRequest, PatchAccountRequest

    assert str(AmountRequest.model_validate({"amount": "12.34"}).amount) == "12.34"
    assert AmountRequest.model_validate({"amount": "7"}).amount == Decimal(7)
    assert str(AmountRequest.model_validate({"amount": "1.50"}).amount) == "1.50"
    assert AmountRequest.model_validate({"amount": "12.3"}).model_dump() == {"amount": 1230}
    assert AmountRequest.model_validate({"amount": "1.234"}).model_dump() == {"amount": "1.234"}
    assert CreateAccountRequest.model_validate({"user_name": "a"}).threshold == 0
    assert CreateAccountRequest.model_validate({"user_name": "a", "threshold": "0.5"}).threshold == Decimal("0.5")
    assert PatchAccountRequest.model_validate({}).threshold is None


# issue 10 item 19: what a schema-driven fuzzer found -----------------------------------------------------------
@pytest.mark.filterwarnings("ignore:Received multipart/form-data without base64 encoding")
@pytest.mark.parametrize(
    "method,path,content_type,raw",
    [
        ("PATCH", "/accounts/7", "multipart/form-data", "--x--\r\n"),  # no boundary: the parser raised (502)
        ("POST", "/inbox/7/messages", "multipart/form-data", ""),
        (
            "PATCH",
            "/accounts/7",
            "multipart/form-data; boundary=x",
            "--x--\r\n",
        ),  # parsed as {}: an empty PATCH went through
        ("PATCH", "/accounts/7", "application/x-www-form-urlencoded", ""),
        (
            "POST",
            "/inbox/7/messages",
            "multipart/form-data; boundary=x",
            '--x\r\nContent-Disposition: form-data; name="biz_type"\r\n\r\npay\r\n--x--\r\n',
        ),
    ],
)
def test_a_form_body_is_415_whatever_its_parts(method, path, content_type, raw):
    answer = call(method, path, raw=raw, headers={"Content-Type": content_type})
    assert_refused(answer, 415, "UNSUPPORTED_MEDIA_TYPE", "send the body as JSON with Content-Type: application/json")


@pytest.mark.parametrize(
    "field,value",
    [("end_at", 2305843009213693951), ("end_at", 253402300800000), ("begin_at", 2**63), ("end_at", 10**400)],
)
def test_a_sale_time_beyond_year_9999_is_refused(field, value):
    """The DB keeps DATETIME(3) (up to 9999-12-31): a larger epoch raised OverflowError in the store (502)."""
    body = {"title": "t", "stock": 1, "begin_at": 0, "end_at": 4102444800000, field: value}
    status, answer, _ = call("POST", "/vouchers", body)
    assert (status, answer["error"]["code"]) == (422, "VALIDATION_ERROR"), answer
    assert answer["error"]["message"].startswith(f"{field}: ")


def test_a_delay_due_time_beyond_year_9999_is_refused():
    status, answer, _ = call("POST", "/delay-queues/q1/items", {"element": "e", "due_at": 2**63})
    assert (status, answer["error"]["code"]) == (422, "VALIDATION_ERROR"), answer


def test_integers_are_json_schema_integers():
    """The document says "integer"; in JSON Schema 3.0 is an integer, so it is accepted as 3. A fraction, a bool or
    a string is not. Money never takes this path: amounts are decimal strings."""
    from api.schemas import CreateRedPacketRequest, DelayTakeRequest, VoucherOrderRequest

    packet = CreateRedPacketRequest.model_validate({"sender_id": 7.0, "total": "1.00", "count": 625.0})
    assert (packet.count, packet.sender_id) == (625, 7) and type(packet.count) is int and type(packet.sender_id) is int
    assert DelayTakeRequest.model_validate({"limit": 10.0}).limit == 10
    for bad in (3.5, True, "3", float("inf"), float("nan"), 1e300):
        with pytest.raises(ValueError):
            VoucherOrderRequest.model_validate({"user_id": bad})


def _amount_schemas() -> dict:
    from api.app import openapi_json

    schemas = json.loads(openapi_json())["components"]["schemas"]
    return {
        "amount": schemas["AmountRequest"]["properties"]["amount"],
        "threshold": schemas["CreateAccountRequest"]["properties"]["threshold"],
    }


AMOUNT_TEXTS = [
    "12.34",
    "0.01",
    "0.1",
    "0.10",
    "7",
    "999999999999.99",
    "1000000000000",
    "999999999999.999",
    "0",
    "0.0",
    "0.00",
    "00.01",
    "1.",
    ".5",
    "1e3",
    "-1.00",
    "+1.00",
    " 1.00",
    "1.00 ",
    "1,00",
    "",
    "NaN",
    "1.234",
    "1.2345",
    "0.001",
    "0.000",
    "0.010",
    "100000000000000.00",
    "0.05",
    "10.5",
    "١٢",
]


@pytest.mark.parametrize("text", AMOUNT_TEXTS, ids=repr)
def test_the_document_states_exactly_which_amounts_the_validator_accepts(text):
    """The amount and threshold schemas carry the pattern the parser enforces: a text matches the pattern exactly when
    it is accepted (no schema-valid amount is refused, no refused one is schema-valid)."""
    import re

    from hotledger.money import InvalidAmount, parse_amount

    for name, allow_zero in (("amount", False), ("threshold", True)):
        schema = _amount_schemas()[name]
        assert schema["type"] == "string" and "pattern" in schema, schema
        try:
            parse_amount(text, allow_zero=allow_zero)
            accepted = True
        except InvalidAmount:
            accepted = False
        assert bool(re.search(schema["pattern"], text)) == accepted, (name, text, schema["pattern"])


def test_the_document_states_integer_bounds_exactly():
    """Bounds survive the 3.0-is-an-integer conversion and are written as integers: 2**63 as a float made
    9223372036854775998 look like a valid voucher id."""
    from api.app import openapi_json

    doc = json.loads(openapi_json())
    limit = doc["components"]["schemas"]["DelayTakeRequest"]["properties"]["limit"]
    assert (limit["type"], limit["exclusiveMinimum"], limit["maximum"]) == ("integer", 0, 1000)
    end_at = doc["components"]["schemas"]["CreateVoucherRequest"]["properties"]["end_at"]
    assert end_at["maximum"] == 253402300799999 and "le" not in end_at
    voucher_id = doc["paths"]["/vouchers/{voucher_id}/orders"]["post"]["parameters"][0]["schema"]
    assert voucher_id["exclusiveMaximum"] == 2**63 and type(voucher_id["exclusiveMaximum"]) is int
