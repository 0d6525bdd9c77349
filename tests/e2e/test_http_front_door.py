"""FrontDoor http over HTTP on the local runtime (HOTLEDGER_FRONT_DOOR=http): the HTTP API's JWT authorizer checks the
token (signature, issuer, audience, expiry) before the function runs, the function gets payload v2 events with the
verified claims and callers act only as themselves; what the authorizer refuses is its own 401."""

from __future__ import annotations

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from helpers import LocalService
from infra import dev_issuer, services


@pytest.fixture(scope="module")
def service(backing_services, tmp_path_factory):
    svc = LocalService(
        services.free_port(),
        {"HOTLEDGER_API_WORKERS": "2", "HOTLEDGER_FRONT_DOOR": "http"},
        tmp_path_factory.mktemp("http-front-door") / "runtime.log",
        ("--no-schedules",),
    )
    svc.start()
    yield svc
    svc.stop()


def test_a_backend_charges_and_an_end_user_acts_only_as_themselves(service):
    backend = dev_issuer.token(scopes=("service", "admin"))
    status, created = service.request("POST", "/accounts", {"user_name": "front-door-http"}, token=backend)
    assert status == 201, created
    own = created["user_id"]
    assert service.request("POST", f"/accounts/{own}/recharge", {"amount": "10.00"}, token=backend)[0] == 200
    status, charged = service.request("POST", f"/accounts/{own}/deduct", {"amount": "2.50"}, token=backend)
    assert status == 200 and charged["balance"] == "7.50", charged
    user = dev_issuer.token(sub=own)
    assert service.request("GET", f"/accounts/{own}", token=user)[1]["balance"] == "7.50"
    status, body = service.request("GET", f"/accounts/{own + 1}", token=user)
    assert status in (403, 404) and body["error"]["code"] in ("FORBIDDEN", "ACCOUNT_NOT_FOUND")
    status, body = service.request("POST", f"/accounts/{own}/recharge", {"amount": "5.00"}, token=user)
    assert status == 403 and body["error"]["code"] == "FORBIDDEN"
    assert service.request("GET", f"/accounts/{own}", token=backend)[1]["balance"] == "7.50"


def test_the_jwt_authorizer_refuses_what_it_cannot_verify_and_the_description_is_public(service):
    genuine = jwt.decode(dev_issuer.token(scopes=("service",)), options={"verify_signature": False})
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refused = {
        "none": None,
        "garbage": "abc",
        "expired": dev_issuer.token(scopes=("service",), ttl_s=-1),
        "forged": jwt.encode(genuine, other_key, algorithm="RS256", headers={"kid": dev_issuer.KEY_ID}),
        "another app client": dev_issuer.token(scopes=("service",), client_id="someone-else"),
        "another issuer": dev_issuer.token(scopes=("service",), iss="https://issuer.example"),
    }
    for name, token in refused.items():
        assert service.request("GET", "/accounts/1", token=token) == (401, {"message": "Unauthorized"}), name
    status, doc = service.request("GET", "/openapi.json", token=None)
    assert status == 200 and doc["paths"]
