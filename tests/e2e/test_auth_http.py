"""Callers act only as themselves, over HTTP on the local runtime behind the REST front door (FrontDoor rest; the HTTP
API's, the template's default, is tests/e2e/test_http_front_door.py): the template's Lambda authorizer runs before
every request (as API Gateway runs it) against the local dev issuer, with tokens from `make token`; refusals come
in the ErrorResponse shape (the REST API's gateway responses) and change nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
import uuid

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from helpers import REPO, LocalService
from infra import dev_issuer, services


@pytest.fixture(scope="module")
def service(backing_services, tmp_path_factory):  # the run's Redis is in the environment before the runtime starts
    svc = LocalService(
        services.free_port(),
        {"HOTLEDGER_API_WORKERS": "2", "HOTLEDGER_FRONT_DOOR": "rest"},
        tmp_path_factory.mktemp("auth") / "runtime.log",
        ("--no-schedules",),
    )
    svc.start()
    yield svc
    svc.stop()


def make_token(**variables: str) -> str:
    """`make -s token ...` as a user runs it (with this run's interpreter path)."""
    args = [f"{name}={value}" for name, value in variables.items()]
    run = subprocess.run(
        ["make", "-s", "token", *args, f"PYTHONPATH={os.environ.get('PYTHONPATH', 'functions:.')}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and run.stdout.count("\n") == 1, run.stdout + run.stderr
    return run.stdout.strip()


def assert_error(answer, status: int, code: str):
    assert answer[0] == status and answer[1]["error"]["code"] == code and answer[1]["error"]["message"], answer


def test_without_a_valid_token_every_route_but_the_description_is_401(service):
    status, doc = service.request("GET", "/openapi.json", token=None)
    with urllib.request.urlopen(service.base + "/swagger", timeout=10) as swagger:  # no token
        assert status == 200 and swagger.status == 200 and b"openapi.json" in swagger.read()
    operations = [
        (method.upper(), re.sub(r"\{\w+\}", "1", path)) for path, ops in doc["paths"].items() for method in ops
    ]
    assert len(operations) >= 30
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    genuine = jwt.decode(dev_issuer.token(scopes=("service", "admin")), options={"verify_signature": False})
    tokens = {
        "none": None,
        "garbage": "abc",
        "expired": dev_issuer.token(scopes=("service", "admin"), ttl_s=-1),
        "forged": jwt.encode(genuine, other_key, algorithm="RS256", headers={"kid": dev_issuer.KEY_ID}),
    }
    for _name, token in tokens.items():
        for method, path in [*operations, ("GET", "/no-such-route")]:
            answer = service.request(method, path, {"anything": 1} if method != "GET" else None, token=token)
            assert_error(answer, 401, "UNAUTHENTICATED")
    assert request_path_tracebacks(service.log_text()) == []


def request_path_tracebacks(log: str) -> list[str]:
    """The tracebacks raised on a request's path (the local gateway, the authorizer, the API). The same runtime log
    holds the writer's, which logs and retries a transient failure (a deadlock between two partitions' writers)."""
    blocks = log.split("Traceback (most recent call last):")[1:]
    return [
        b
        for b in blocks
        if any(place in b for place in ("localrt/gateway.py", "functions/authorizer/", "functions/api/"))
    ]


def test_an_end_user_cannot_read_or_move_another_accounts_money(service, sql):
    admin_and_service = make_token(SCOPES="service admin")

    def as_backend(method, path, body=None):
        return service.request(method, path, body, token=admin_and_service)

    alice = as_backend("POST", "/accounts", {"user_name": f"alice-{uuid.uuid4().hex[:8]}"})[1]["user_id"]
    bob = as_backend("POST", "/accounts", {"user_name": f"bob-{uuid.uuid4().hex[:8]}"})[1]["user_id"]
    for user_id in (alice, bob):
        assert as_backend("POST", f"/accounts/{user_id}/recharge", {"amount": "20.00"})[0] == 200
    packet = as_backend("POST", "/redpackets", {"sender_id": bob, "total": "2.00", "count": 2})[1]["packet_id"]
    voucher = as_backend("POST", "/vouchers", {"title": "t", "stock": 3, "begin_at": 0, "end_at": 4102444800000})[1][
        "voucher_id"
    ]
    alice_token = make_token(SUB=str(alice))
    balances = [as_backend("GET", f"/accounts/{u}")[1]["balance"] for u in (alice, bob)]

    for method, path, body in [
        ("GET", f"/accounts/{bob}", None),
        ("POST", f"/accounts/{bob}/deduct", {"amount": "1.00"}),
        ("POST", f"/accounts/{alice}/recharge", {"amount": "1000.00"}),
        ("POST", f"/redpackets/{packet}/grab", {"user_id": bob}),
        ("POST", f"/vouchers/{voucher}/orders", {"user_id": bob}),
        ("PATCH", f"/accounts/{alice}", {"threshold": "-50.00"}),
    ]:
        assert_error(service.request(method, path, body, token=alice_token), 403, "FORBIDDEN")
    assert [as_backend("GET", f"/accounts/{u}")[1]["balance"] for u in (alice, bob)] == balances
    assert as_backend("GET", f"/redpackets/{packet}")[1]["claimed"] == 0
    assert as_backend("GET", f"/vouchers/{voucher}")[1]["stock_left"] == 3
    # the DB too, once the writer has caught up (it persists bob's packet debit whenever it gets to it): a deduct of
    # 0.01 each after the refusals comes behind anything they published on the account's partition
    for user_id in (alice, bob):
        assert as_backend("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"})[0] == 200
    entries = "SELECT user_id, {} FROM {} WHERE user_id IN (%s, %s) ORDER BY user_id, 2"
    service.wait_until(
        lambda: len(sql(entries.format("amount", "t_order"), (alice, bob))) >= 3, 60, "the deducts in the DB"
    )
    assert sql(entries.format("amount", "t_order"), (alice, bob)) == ((alice, 1), (bob, 1), (bob, 200))
    assert sql(entries.format("pay", "t_pay"), (alice, bob)) == ((alice, 2000), (bob, 2000))

    assert service.request("GET", f"/accounts/{alice}", token=alice_token)[1]["balance"] == "19.99"  # her own
    assert service.request("POST", f"/redpackets/{packet}/grab", {"user_id": alice}, token=alice_token)[0] == 200


def test_a_service_token_cannot_do_what_operators_do(service):
    service_token, operator = make_token(SCOPES="service"), make_token(SCOPES="admin")
    user_id = service.request("POST", "/accounts", {"user_name": f"svc-{uuid.uuid4().hex[:8]}"}, token=operator)[1][
        "user_id"
    ]
    assert service.request("PATCH", f"/accounts/{user_id}", {"api_open": False}, token=operator)[1]["api_open"] is False
    for method, path, body in [
        ("PATCH", f"/accounts/{user_id}", {"api_open": True}),
        ("POST", "/accounts", {"user_name": f"no-{uuid.uuid4().hex[:8]}"}),
        ("POST", "/vouchers", {"title": "t", "stock": 1, "begin_at": 0, "end_at": 4102444800000}),
    ]:
        assert_error(service.request(method, path, body, token=service_token), 403, "FORBIDDEN")
    assert_error(
        service.request("POST", f"/accounts/{user_id}/recharge", {"amount": "5.00"}, token=operator), 403, "FORBIDDEN"
    )
    assert service.request("GET", f"/accounts/{user_id}", token=service_token)[1]["api_open"] is False


def test_the_token_make_prints_is_one_line_with_the_scopes_asked(service):
    claims = jwt.decode(make_token(SCOPES="service admin"), options={"verify_signature": False})
    assert claims["scope"] == "hotledger/service hotledger/admin" and claims["iss"] == dev_issuer.ISSUER
    assert json.dumps(jwt.decode(make_token(SUB="7"), options={"verify_signature": False})["username"]) == '"7"'
