"""Who may call what, without servers: the route table against the routes, the authorizer function (the real
handler, against the local dev issuer's key set served over HTTP as Cognito serves it), and the refusals the API
handler gives before anything is parsed or any service is asked."""

from __future__ import annotations

import io
import json
import re
import time
from contextlib import redirect_stdout

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from helpers import caller_context
from infra import dev_issuer
from infra.localrt import events

METHOD_ARN = "arn:aws:execute-api:us-east-1:000000000000:api123/v1/POST/accounts/7/deduct"


def test_every_route_has_exactly_one_rule_and_every_rule_a_route():
    from api import authorization
    from api.app import app

    routes = {(r.method, r.path) for r in (*app._static_routes, *app._dynamic_routes)}
    assert routes == set(authorization.rules())
    assert {key for key, rule in authorization.rules().items() if rule.public} == {
        ("GET", "/openapi.json"),
        ("GET", "/swagger"),
    }


def test_the_openapi_document_names_the_bearer_scheme_and_401_403_on_every_operation():
    from api.app import openapi_json

    doc = json.loads(openapi_json())
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": "a Cognito (or local dev issuer) ID or access token",
    }
    assert doc["security"] == [{"bearer": []}]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            assert "UNAUTHENTICATED" in operation["responses"]["401"]["description"], (method, path)
            assert "FORBIDDEN" in operation["responses"]["403"]["description"], (method, path)
    assert "API_CLOSED" in doc["paths"]["/accounts/{user_id}/deduct"]["post"]["responses"]["403"]["description"]


# the authorizer function -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def authorizer():
    """The authorizer handler configured for the dev issuer, as the local runtime runs it."""
    from authorizer import app

    issuer = dev_issuer.JwksServer().serve_in_thread()
    saved = app._verifier
    app._verifier = app.Verifier(
        app.Settings(issuer=dev_issuer.ISSUER, jwks_url=issuer.url, client_ids=frozenset({dev_issuer.CLIENT_ID}))
    )
    with redirect_stdout(io.StringIO()):
        yield lambda token: app.handler({"type": "TOKEN", "authorizationToken": token, "methodArn": METHOD_ARN}, None)
    app._verifier = saved
    issuer.shutdown()


def refused(authorizer, token: str) -> bool:
    with pytest.raises(Exception) as raised:
        authorizer(token)
    return str(raised.value) == "Unauthorized"  # API Gateway's contract for 401


def test_a_client_credentials_token_becomes_its_scopes_and_every_method_is_allowed(authorizer):
    answer = authorizer("Bearer " + dev_issuer.token(scopes=("service", "admin")))
    assert answer["context"] == {
        "kind": "client",
        "user_id": "",
        "scopes": "admin service",
        "expires_at": answer["context"]["expires_at"],
    }
    assert answer["context"]["expires_at"] > time.time()
    assert answer["policyDocument"]["Statement"] == [
        {
            "Action": "execute-api:Invoke",
            "Effect": "Allow",
            "Resource": "arn:aws:execute-api:us-east-1:000000000000:api123/v1/*",
        }
    ]


def test_an_end_user_token_becomes_its_account_and_foreign_scopes_are_dropped(authorizer):
    answer = authorizer(dev_issuer.token(sub=42, scope="openid aws.cognito.signin.user.admin other/admin"))
    assert answer["context"]["kind"] == "user" and answer["context"]["user_id"] == "42"
    assert answer["context"]["scopes"] == ""


def test_an_id_token_and_the_admin_group_count_like_cognito_gives_them(authorizer):
    token = dev_issuer.token(
        token_use="id",
        aud=dev_issuer.CLIENT_ID,
        client_id=None,
        username=None,
        **{"cognito:username": "9", "cognito:groups": ["admin"]},
    )
    answer = authorizer(token)
    assert (answer["context"]["user_id"], answer["context"]["scopes"]) == ("9", "admin")


def test_a_username_that_is_no_account_id_owns_nothing(authorizer):
    for username in ("alice", "0", "007", "2147483648", "٣"):
        assert authorizer(dev_issuer.token(sub=username))["context"]["user_id"] == "", username


@pytest.mark.parametrize(
    "case",
    [
        "expired",
        "other key",
        "other issuer",
        "other client",
        "refresh token",
        "alg none",
        "unknown kid",
        "garbage",
        "empty",
        "id token other audience",
        "id token expired",
        "id token other issuer",
        "no token use",
    ],
)
def test_a_token_that_is_not_valid_is_refused(authorizer, case):
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    genuine = jwt.decode(dev_issuer.token(scopes=("service",)), options={"verify_signature": False})
    header = {"kid": dev_issuer.KEY_ID}
    token = {
        "expired": lambda: dev_issuer.token(scopes=("service",), ttl_s=-1),
        "other key": lambda: jwt.encode(genuine, other_key, algorithm="RS256", headers=header),
        "other issuer": lambda: dev_issuer.token(scopes=("service",), iss="https://cognito-idp.example/other"),
        "other client": lambda: dev_issuer.token(scopes=("service",), client_id="someone-else"),
        "refresh token": lambda: dev_issuer.token(scopes=("service",), token_use="refresh"),
        "alg none": lambda: jwt.encode(genuine, None, algorithm="none", headers=header),
        "unknown kid": lambda: jwt.encode(genuine, other_key, algorithm="RS256", headers={"kid": "nope"}),
        "garbage": lambda: "not.a.token",
        # ID tokens name their app client in aud (access tokens in client_id): each check holds for both kinds
        "id token other audience": lambda: dev_issuer.token(
            token_use="id", aud="someone-else", client_id=None, **{"cognito:username": "9"}
        ),
        "id token expired": lambda: dev_issuer.token(
            token_use="id", aud=dev_issuer.CLIENT_ID, client_id=None, ttl_s=-1, **{"cognito:username": "9"}
        ),
        "id token other issuer": lambda: dev_issuer.token(
            token_use="id",
            aud=dev_issuer.CLIENT_ID,
            client_id=None,
            iss="https://cognito-idp.example/other",
            **{"cognito:username": "9"},
        ),
        "no token use": lambda: dev_issuer.token(scopes=("service",), token_use=None),
        "empty": lambda: "",
    }[case]()
    assert refused(authorizer, token)


def test_tokens_with_unknown_kids_refetch_the_key_set_at_most_once_a_minute(monkeypatch):
    """Issue 19 item 12: an unknown kid (a rotated pool key) may fetch the JWKS again, but a stream of forged kids
    is not a JWKS amplifier: at most one refetch a minute."""
    import jwt.jwks_client
    from authorizer import app

    issuer = dev_issuer.JwksServer().serve_in_thread()
    verifier = app.Verifier(
        app.Settings(issuer=dev_issuer.ISSUER, jwks_url=issuer.url, client_ids=frozenset({dev_issuer.CLIENT_ID}))
    )
    now = [1000.0]
    monkeypatch.setattr(jwt.jwks_client.time, "monotonic", lambda: now[0])
    genuine = jwt.decode(dev_issuer.token(scopes=("service",)), options={"verify_signature": False})
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = [jwt.encode(genuine, other_key, algorithm="RS256", headers={"kid": f"k{n}"}) for n in range(20)]
    verifier.verify(dev_issuer.token(scopes=("service",)))
    assert issuer.fetches == 1
    for seconds, token in zip(range(0, 100, 5), forged, strict=False):  # one forged kid every 5 s for 100 s
        now[0] = 1000.0 + seconds
        with pytest.raises(app.InvalidToken):
            verifier.verify(token)
    assert issuer.fetches - 1 <= 2, issuer.fetches  # refetches in 100 s: at most one per 60 s
    issuer.shutdown()


@pytest.mark.parametrize("cache_control,kept_s", [("public, max-age=7200", 7200), ("max-age=5", 60), (None, 3600)])
def test_the_key_set_is_kept_as_long_as_the_issuers_cache_control_says(cache_control, kept_s):
    """Issue 19 item 12: cache-control honoured: the key set is kept for the issuer's max-age (never less than the
    one-minute refetch cooldown), for the client's own lifespan when the issuer says nothing."""
    from authorizer import app

    issuer = dev_issuer.JwksServer(cache_control=cache_control).serve_in_thread()
    verifier = app.Verifier(
        app.Settings(issuer=dev_issuer.ISSUER, jwks_url=issuer.url, client_ids=frozenset({dev_issuer.CLIENT_ID}))
    )
    verifier.verify(dev_issuer.token(scopes=("service",)))
    assert verifier.jwks.jwk_set_cache.lifespan == kept_s
    issuer.shutdown()


# the API handler's own refusals (no server: they come before any service is asked) -------------------------
def call(method: str, path: str, body=None, authorizer: dict | None = None) -> tuple[int, dict]:
    from api.app import handler

    event = events.api_gateway_proxy(
        method,
        path,
        json.dumps(body) if body is not None else None,
        {"Content-Type": "application/json"},
        authorizer=authorizer,
    )
    with redirect_stdout(io.StringIO()):
        response = handler(event, events.LambdaContext("ApiFunction"))
    return response["statusCode"], json.loads(response["body"]) if response["body"].startswith("{") else response[
        "body"
    ]


def test_without_a_caller_every_route_but_the_description_is_401_whatever_the_body():
    from api import authorization

    names = {"queue": "emails", "biz": "password-recovery", "element": "e1"}
    for (method, rule_path), rule in authorization.rules().items():
        path = re.sub(r"<(\w+)>", lambda m: names.get(m.group(1), "1"), rule_path)
        status, body = call(method, path, {"not": "valid"})
        if rule.public:
            assert status == 200, (method, path)
        else:
            assert (status, body["error"]["code"]) == (401, "UNAUTHENTICATED"), (method, path, body)


def test_a_caller_whose_token_expired_is_401_even_if_api_gateway_cached_it():
    status, body = call("GET", "/vouchers/1", authorizer=caller_context(ttl_s=-1))
    assert (status, body["error"]["code"]) == (401, "UNAUTHENTICATED")


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("POST", "/accounts", {"user_name": "x"}),
        ("PATCH", "/accounts/7", {"api_open": True}),
        ("POST", "/vouchers", {}),
        ("POST", "/delay-queues/q/dead-letters/replay", {"elements": ["a"]}),
        ("DELETE", "/delay-queues/q/dead-letters/a", None),
        ("GET", "/delay-queues/q/dead-letters", None),
    ],
)
def test_a_service_cannot_do_what_operators_do(method, path, body):
    status, answer = call(method, path, body, authorizer=caller_context(scopes=("service",)))
    assert (status, answer["error"]["code"]) == (403, "FORBIDDEN"), answer


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("POST", "/accounts/7/recharge", {"amount": "1.00"}),
        ("POST", "/accounts/7/deduct", {"amount": "1.00"}),
        ("POST", "/redpackets", {"sender_id": 7, "total": "1.00", "count": 1, "expires_in_s": 60}),
        ("POST", "/delay-queues/q/items", {"element": "e", "delay_s": 1}),
    ],
)
def test_an_operator_cannot_move_money_or_use_the_backends_queues(method, path, body):
    status, answer = call(method, path, body, authorizer=caller_context(scopes=("admin",)))
    assert (status, answer["error"]["code"]) == (403, "FORBIDDEN"), answer


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("GET", "/accounts/8", None),
        ("GET", "/accounts/8/orders/5", None),
        ("POST", "/accounts/7/recharge", {"amount": "1.00"}),
        ("POST", "/accounts/7/deduct", {"amount": "1.00"}),
        ("PATCH", "/accounts/7", {"api_open": True}),
        ("POST", "/redpackets/5/grab", {"user_id": 8}),
        ("POST", "/vouchers/5/orders", {"user_id": 8}),
        ("GET", "/inbox/8/messages", None),
        ("POST", "/inbox/7/messages", {"biz_type": "b", "outer_biz_id": "o", "title": "t", "content": "c"}),
        ("POST", "/redpackets", {"sender_id": 7, "total": "1.00", "count": 1, "expires_in_s": 60}),
        ("POST", "/orders", {"user_id": 7, "amount": "1.00", "close_in_s": 60}),
    ],
)
def test_an_end_user_is_refused_for_other_accounts_and_for_what_backends_do(method, path, body):
    """User 7 (these refusals come before any service is asked: the tripwire-free unit run proves it)."""
    status, answer = call(method, path, body, authorizer=caller_context(user_id=7, scopes=()))
    assert (status, answer["error"]["code"]) == (403, "FORBIDDEN"), answer
