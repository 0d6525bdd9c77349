"""The local dev issuer: what the Cognito user pool is in AWS, for the local runtime and the tests.

Its own RSA key pair (generated once into HOTLEDGER_STATE_DIR/dev-issuer/, default .state/, so tokens outlive a
restart) and its key set served over HTTP as Cognito serves /.well-known/jwks.json (JwksServer); the local runtime
points the authorizer at that URL and at this issuer, so the SAME authorizer code verifies local tokens. Tokens have the shape of Cognito access tokens: client-credentials tokens carry the resource
server's scopes (`hotledger/service hotledger/admin`), end-user tokens the username = the account id.

    python -m infra.dev_issuer --scopes "service admin"    # a service/operator token (`make token SCOPES=...`)
    python -m infra.dev_issuer --sub 7                     # an end-user token for account 7 (`make token SUB=7`)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from infra import services

ISSUER = "https://hotledger.local/dev-issuer"
CLIENT_ID = "hotledger-local-dev"
SCOPE_PREFIX = "hotledger/"
KEY_ID = "hotledger-local-dev-1"
_DIR = services.STATE / "dev-issuer"


@functools.cache  # loading checks the key: tens of ms, once per process
def _private_key(directory: Path = _DIR) -> rsa.RSAPrivateKey:
    """The issuer's key, generated on first use. Created with a hard link from a private temporary file, so processes
    starting at once all end up with the one key that won (never two keys, never a half-written file)."""
    path = directory / "private_key.pem"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        tmp = directory / f".key-{uuid.uuid4().hex}"
        tmp.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        os.chmod(tmp, 0o600)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return serialization.load_pem_private_key(path.read_bytes(), password=None)


def key_set(directory: Path = _DIR) -> dict:
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(_private_key(directory).public_key()))
    return {"keys": [{**public, "kid": KEY_ID, "alg": "RS256", "use": "sig"}]}


class JwksServer(HTTPServer):
    """The issuer's /.well-known/jwks.json on 127.0.0.1 (an ephemeral port unless given). Bound at construction, so
    a process can hand the URL to children it forks before it starts serving (serve_in_thread)."""

    def __init__(self, port: int = 0, directory: Path = _DIR, cache_control: str | None = None):
        body = json.dumps(key_set(directory)).encode()
        self.fetches = 0  # key set requests served (tests count the authorizer's refetches)
        server = self

        class Jwks(BaseHTTPRequestHandler):
            def do_GET(self):
                found = self.path == "/.well-known/jwks.json"
                server.fetches += found
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "application/json")
                if cache_control:  # as Cognito's JWKS endpoint may send it
                    self.send_header("Cache-Control", cache_control)
                self.send_header("Content-Length", str(len(body) if found else 0))
                self.end_headers()
                if found:
                    self.wfile.write(body)

            def log_message(self, fmt, *args):
                pass

        super().__init__(("127.0.0.1", port), Jwks)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/.well-known/jwks.json"

    def authorizer_env(self) -> dict[str, str]:
        """The authorizer's settings for this issuer."""
        return {
            "AUTH_ISSUER": ISSUER,
            "AUTH_JWKS_URL": self.url,
            "AUTH_CLIENT_IDS": CLIENT_ID,
            "AUTH_SCOPE_PREFIX": SCOPE_PREFIX,
        }

    def serve_in_thread(self) -> JwksServer:
        threading.Thread(target=self.serve_forever, name="dev-issuer-jwks", daemon=True).start()
        return self


def token(
    sub: int | str | None = None,
    scopes: tuple[str, ...] = (),
    ttl_s: int = 3600,
    groups: tuple[str, ...] = (),
    directory: Path = _DIR,
    **claims,
) -> str:
    """An access token as Cognito issues it: with `sub`, an end user whose username is that account id; with scopes,
    the resource server's scopes (as a client-credentials token has them). Extra claims override (tests)."""
    now = int(time.time())
    body = {
        "iss": ISSUER,
        "token_use": "access",
        "client_id": CLIENT_ID,
        "iat": now,
        "exp": now + ttl_s,
        "jti": str(uuid.uuid4()),
        "scope": " ".join(SCOPE_PREFIX + s for s in scopes),
    }
    if sub is not None:
        body.update(sub=str(sub), username=str(sub))
    else:
        body["sub"] = CLIENT_ID  # client credentials: the subject is the app client
    if groups:
        body["cognito:groups"] = list(groups)
    body.update(claims)
    return jwt.encode(body, _private_key(directory), algorithm="RS256", headers={"kid": KEY_ID})


def caller_context(user_id: int | None, scopes: tuple[str, ...], ttl_s: int = 3600) -> dict:
    """requestContext.authorizer as API Gateway passes the authorizer's answer for such a caller, for driving the
    API handler without the gateway (tests, benchmarks)."""
    from authorizer.app import Caller

    caller = Caller(
        principal=str(user_id) if user_id is not None else CLIENT_ID,
        kind="client" if user_id is None else "user",
        user_id=user_id,
        scopes=frozenset(scopes),
        expires_at=int(time.time()) + ttl_s,
    )
    return {"principalId": caller.principal, **caller.context()}


def jwt_authorizer_context(
    user_id: int | None, scopes: tuple[str, ...], ttl_s: int = 3600, groups: tuple[str, ...] = (), **claims
) -> dict:
    """requestContext.authorizer.jwt as the HTTP API's JWT authorizer passes a verified token of such a caller: its
    claims, each value as text (a list as "[a b]"), and the token's scopes."""
    decoded = jwt.decode(token(user_id, scopes, ttl_s, groups, **claims), options={"verify_signature": False})
    return api_gateway_claims(decoded)


def api_gateway_claims(claims: dict) -> dict:
    """The JWT authorizer's view of verified claims: every value as text, a list as "[a b]" (Go's formatting)."""
    text = {
        name: "[" + " ".join(map(str, value)) + "]" if isinstance(value, list) else str(value)
        for name, value in claims.items()
    }
    scopes = str(claims.get("scope") or "").split()
    return {"claims": text, "scopes": scopes or None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="print a token of the local dev issuer (one line)")
    parser.add_argument("--sub", help="the account id an end user acts as")
    parser.add_argument("--scopes", default="", help='space-separated: "service", "admin" or "service admin"')
    parser.add_argument("--ttl", type=int, default=3600, help="seconds until it expires")
    args = parser.parse_args(argv)
    if args.sub is None and not args.scopes.split():
        parser.error('give SUB=<account id> or SCOPES="service admin"')
    print(token(args.sub, tuple(args.scopes.split()), args.ttl))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
