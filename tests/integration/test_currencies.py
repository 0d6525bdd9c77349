"""Issue 34, currencies: an account's currency is fixed at creation, its amounts are checked against its minor unit
(JPY 0, USD 2, KWD 3 fractional digits) and answered with its digits; through the API function's handler."""

import pytest


def _refused_amount(answer, currency: str) -> None:
    status, body = answer
    assert status == 422, body
    assert body["error"]["code"] == "INVALID_AMOUNT", body
    assert currency in body["error"]["message"], body


def test_an_account_without_a_currency_holds_the_default_one(api):
    user_id = api.account(balance="12.34")
    status, body = api("GET", f"/accounts/{user_id}")
    assert status == 200 and body["currency"] == "USD" and body["balance"] == "12.34", body


def test_yen_have_no_fractional_digits(api):
    user_id = api.account(currency="JPY", threshold="100")
    status, body = api("POST", f"/accounts/{user_id}/recharge", {"amount": "5000"})
    assert status == 200 and body["amount"] == "5000" and body["balance"] == "5000", body
    _refused_amount(api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.5"}), "JPY")
    _refused_amount(api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.0"}), "JPY")  # digits, not value
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1234"})
    assert status == 200 and body["amount"] == "1234" and body["balance"] == "3766", body
    status, order = api("GET", f"/accounts/{user_id}/orders/{body['order_id']}")
    assert order["amount"] == "1234" and order["balance_after"] == "3766", order
    status, body = api("GET", f"/accounts/{user_id}")
    assert body["currency"] == "JPY" and body["balance"] == "3766" and body["threshold"] == "100", body
    assert body["available"] == "3766" and body["held"] == "0", body
    # the threshold is a minor-unit amount too: 100 yen, refused below it
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "3667"})
    assert status == 402 and body["error"]["code"] == "INSUFFICIENT_BALANCE", body
    status, page = api("GET", f"/accounts/{user_id}/entries")
    assert status == 200 and {e["amount"] for e in page["entries"]} == {"5000", "1234"}, page


def test_dinars_have_three(api):
    user_id = api.account(currency="KWD")
    status, body = api("POST", f"/accounts/{user_id}/recharge", {"amount": "1.234"})
    assert status == 200 and body["amount"] == "1.234" and body["balance"] == "1.234", body
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.5"})
    assert status == 200 and body["amount"] == "0.500" and body["balance"] == "0.734", body
    _refused_amount(api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.0001"}), "KWD")
    status, body = api("GET", f"/accounts/{user_id}")
    assert body["balance"] == "0.734", body


def test_dollars_refuse_a_third_digit_and_nothing_changes(api):
    user_id = api.account(balance="10.00", currency="USD")
    _refused_amount(api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.234"}), "USD")
    _refused_amount(api("POST", f"/accounts/{user_id}/recharge", {"amount": "0.001"}), "USD")
    _refused_amount(api("PATCH", f"/accounts/{user_id}", {"threshold": "0.005"}), "USD")
    status, body = api("GET", f"/accounts/{user_id}")
    assert body["balance"] == "10.00" and body["version"] == 2 and body["threshold"] == "0.00", body


@pytest.mark.parametrize(
    "body,code",
    [
        ({"currency": "XYZ"}, "VALIDATION_ERROR"),
        ({"currency": "usd"}, "VALIDATION_ERROR"),
        ({"currency": 840}, "VALIDATION_ERROR"),
        ({"currency": "JPY", "threshold": "0.5"}, "INVALID_AMOUNT"),
    ],
)
def test_an_account_in_no_supported_currency_is_not_made(api, body, code):
    name = f"cur-{code}-{body['currency']}"
    status, answer = api("POST", "/accounts", {"user_name": name, **body})
    assert status == 422 and answer["error"]["code"] == code, answer
    assert api("POST", "/accounts", {"user_name": name})[0] == 201  # the name was not taken


def test_the_currency_is_fixed(api):
    user_id = api.account(currency="EUR")
    status, body = api("PATCH", f"/accounts/{user_id}", {"currency": "USD"})
    assert status == 422 and body["error"]["code"] == "VALIDATION_ERROR", body
    assert api("GET", f"/accounts/{user_id}")[1]["currency"] == "EUR"


def test_a_process_without_the_redis_copy_reads_the_db(api):
    """The currency's Redis copy lost (a Redis loss) and a fresh process: read from t_account again."""
    from hotledger import keys, runtime
    from hotledger.dal.redis_store import lua

    user_id = api.account(currency="JPY", balance="700")
    lua().client.delete(keys.currency(user_id))
    runtime.currencies.cache_clear()
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "7"})
    assert status == 200 and body["balance"] == "693", body
    _refused_amount(api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.7"}), "JPY")


def test_holds_refunds_and_payment_orders_take_the_accounts_digits(api):
    user_id = api.account(currency="JPY", balance="1000")
    _refused_amount(api("POST", f"/accounts/{user_id}/holds", {"amount": "1.5", "expires_in_s": 60}), "JPY")
    status, hold = api("POST", f"/accounts/{user_id}/holds", {"amount": "300", "expires_in_s": 60})
    assert status == 201 and hold["amount"] == "300" and hold["available"] == "700", hold
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "100"})
    _refused_amount(api("POST", f"/accounts/{user_id}/orders/{body['order_id']}/refunds", {"amount": "0.5"}), "JPY")
    _refused_amount(api("POST", "/orders", {"user_id": user_id, "amount": "9.99", "close_in_s": 60}), "JPY")
    status, order = api("POST", "/orders", {"user_id": user_id, "amount": "999", "close_in_s": 60})
    assert status == 201 and order["amount"] == "999", order


def test_a_red_packet_pays_only_grabbers_of_its_currency(api):
    sender = api.account(currency="JPY", balance="1000")
    status, packet = api("POST", "/redpackets", {"sender_id": sender, "total": "300", "count": 3})
    assert status == 201 and packet["total"] == "300", packet
    yen, dollars = api.account(currency="JPY"), api.account(currency="USD")
    status, grab = api("POST", f"/redpackets/{packet['packet_id']}/grab", {"user_id": yen})
    assert status == 200 and "." not in grab["amount"], grab
    status, body = api("POST", f"/redpackets/{packet['packet_id']}/grab", {"user_id": dollars})
    assert status == 422 and body["error"]["code"] == "CURRENCY_MISMATCH", body
    _refused_amount(api("POST", "/redpackets", {"sender_id": sender, "total": "3.5", "count": 3}), "JPY")


def test_a_monitor_alert_in_the_inbox_and_a_webhook_write_the_accounts_digits():
    from hotledger.money import Currency
    from hotledger.monitors.store import Alert
    from hotledger.webhooks.events import alert_payload

    body = alert_payload(Alert(1, 2, 3, "below", 500, 499, 0), None, Currency.of("JPY").decimals)
    assert '"threshold":"500"' in body and '"balance":"499"' in body, body
