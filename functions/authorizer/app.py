"""The API's Lambda authorizer (TOKEN): verifies a Cognito JWT against the user pool's JWKS, ID or access token
alike, and hands API Gateway the caller as authorizer context: {kind, user_id, scopes, expires_at}. The API function
reads only that context (api.authorization) and decides per route; it never parses the token.

The caller:
- scopes: the resource server's scopes in the token (`hotledger/service` -> service, `hotledger/admin` -> admin);
  membership of the `admin` group counts as the admin scope (operators signing in as users).
- user_id: the account an end user acts as: the Cognito username (`username` in access tokens, `cognito:username`
  in ID tokens) when it is an account id; client-credentials tokens have no username (kind "client").
Locally the same code runs before each API request against the local dev issuer (infra/dev_issuer.py), whose
tokens have the same shape.

Settings (environment): AUTH_ISSUER (the pool's issuer URL), AUTH_JWKS_URL (its /.well-known/jwks.json),
AUTH_CLIENT_IDS (comma-separated app clients whose tokens are accepted), AUTH_SCOPE_PREFIX (`hotledger/`),
AUTH_ADMIN_GROUP (`admin`)."""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import jwt

from authorizer.claims import Caller, InvalidToken, caller_of_claims
from hotledger import observability

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = observability.logger()


@dataclass(frozen=True)
class Settings:
    issuer: str
    jwks_url: str
    client_ids: frozenset[str]
    scope_prefix: str = "hotledger/"
    admin_group: str = "admin"

    @classmethod
    def from_env(cls) -> Settings:
        # all required: an authorizer without them must refuse everyone, not accept anyone
        return cls(
            issuer=os.environ["AUTH_ISSUER"],
            jwks_url=os.environ["AUTH_JWKS_URL"],
            client_ids=frozenset(c.strip() for c in os.environ["AUTH_CLIENT_IDS"].split(",") if c.strip()),
            scope_prefix=os.environ.get("AUTH_SCOPE_PREFIX", "hotledger/"),
            admin_group=os.environ.get("AUTH_ADMIN_GROUP", "admin"),
        )


JWKS_REFETCH_COOLDOWN_S = 60
_MAX_AGE = re.compile(r"max-age=(\d+)")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None  # the key set is read from its own URL only, as PyJWT does


class CachingJwksClient(jwt.PyJWKClient):
    """PyJWT's client, keeping the key set as long as the issuer's Cache-Control max-age says (never less than the
    refetch cooldown; its own lifespan when the issuer says nothing). Only the fetch is its own: PyJWT reads no
    response headers."""

    def fetch_data(self) -> Any:  # the JWKS document as read (PyJWT's type)
        request = urllib.request.Request(url=self.uri, headers=self.headers)
        try:
            with urllib.request.build_opener(_NoRedirect()).open(request, timeout=self.timeout) as response:
                max_age = _MAX_AGE.search(response.headers.get("Cache-Control") or "")
                jwk_set = json.load(response)
        except (urllib.error.URLError, TimeoutError, http.client.HTTPException, ValueError) as exc:
            raise jwt.PyJWKClientConnectionError(f"the key set could not be read: {exc}") from exc
        if self.jwk_set_cache is not None:
            if max_age:
                self.jwk_set_cache.lifespan = max(int(max_age.group(1)), JWKS_REFETCH_COOLDOWN_S)
            self.jwk_set_cache.put(jwk_set)  # raises PyJWKSetError for a payload with no usable key
        self._last_successful_fetch = time.monotonic()
        return jwk_set


class Verifier:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # keys are cached for the container's life; an unknown kid (a rotated pool key) fetches the set again, at
        # most once a minute (PyJWT's cooldown): tokens with made-up kids must not make the authorizer hammer the JWKS
        self.jwks = CachingJwksClient(
            settings.jwks_url, cache_keys=True, lifespan=3600, timeout=5, cooldown_duration=JWKS_REFETCH_COOLDOWN_S
        )

    def verify(self, token: str) -> Caller:
        raw = token.removeprefix("Bearer ").strip()
        try:
            key = self.jwks.get_signing_key_from_jwt(raw)
            claims = jwt.decode(
                raw,
                key.key,
                algorithms=["RS256"],
                issuer=self.settings.issuer,
                options={"require": ["exp", "iat", "iss", "sub", "token_use"], "verify_aud": False},
            )
        except jwt.PyJWKClientConnectionError:
            raise  # the JWKS could not be read: not the caller's fault (API Gateway: AUTHORIZER_FAILURE)
        except (jwt.InvalidTokenError, jwt.PyJWKClientError) as exc:
            raise InvalidToken(str(exc)) from exc
        client, caller = caller_of_claims(claims, self.settings.scope_prefix, self.settings.admin_group)
        if client not in self.settings.client_ids:
            raise InvalidToken(f"app client {client!r} is not accepted")
        return caller


def allow_policy(method_arn: str) -> dict[str, Any]:
    """Allow every method of the stage: API Gateway caches the answer per token, and the API function decides
    per route (a policy naming only this method would refuse the token's next, different request from the cache)."""
    api, stage = method_arn.split("/")[:2]
    return {
        "Version": "2012-10-17",
        "Statement": [{"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": f"{api}/{stage}/*"}],
    }


_verifier: Verifier | None = None


def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    global _verifier
    if _verifier is None:
        _verifier = Verifier(Settings.from_env())
    try:
        caller = _verifier.verify(event.get("authorizationToken") or "")
    except InvalidToken as exc:
        logger.info("token refused", extra={"reason": str(exc)})
        # API Gateway's contract: exactly this message answers 401 (the UNAUTHORIZED gateway response)
        raise Exception("Unauthorized") from None
    return {
        "principalId": caller.principal,
        "policyDocument": allow_policy(event["methodArn"]),
        "context": caller.context(),
    }
