"""What API Gateway does before it invokes the API function: the Lambda authorizer (TOKEN payload) the template
names as the API's default, on every route but those whose event says `Auth: {Authorizer: NONE}`, answered with
the template's gateway responses. It runs the SAME authorizer function the stack deploys.

The contract emulated (API Gateway REST, Lambda authorizer, TOKEN):
- no identity header, or one the ValidationExpression does not match: UNAUTHORIZED (401), the authorizer not invoked;
- the authorizer raises "Unauthorized": UNAUTHORIZED; any other failure: AUTHORIZER_FAILURE (500 unless configured);
- a policy that does not allow the method (or denies it): ACCESS_DENIED (403);
- allowed: the function gets principalId and the returned context in requestContext.authorizer."""

from __future__ import annotations

import fnmatch
import logging
import time
from dataclasses import dataclass

from infra.localrt import template

log = logging.getLogger("localrt")
_DEFAULT_RESPONSES = {
    "UNAUTHORIZED": (401, '{"message":"Unauthorized"}'),
    "ACCESS_DENIED": (403, '{"message":"User is not authorized to access this resource"}'),
    "AUTHORIZER_FAILURE": (500, '{"message":null}'),
}


@dataclass(frozen=True)
class Refused:
    status: int
    body: str


class Gate:
    def __init__(self, config: template.ApiAuthorizer, authorizer, public_routes: set[tuple[str, str]], context):
        self.config, self.authorizer, self.public_routes, self.context = config, authorizer, public_routes, context

    def _refuse(self, kind: str) -> Refused:
        status, body = self.config.gateway_responses.get(kind) or _DEFAULT_RESPONSES[kind]
        return Refused(status or _DEFAULT_RESPONSES[kind][0], body)

    def admit(self, method: str, path: str, headers: dict) -> Refused | dict | None:
        """Refused, the authorizer context for the function, or None on a public route."""
        if (method, path) in self.public_routes:
            return None
        wanted = self.config.header.lower()
        token = next((value for name, value in headers.items() if name.lower() == wanted), "")
        if not token or (self.config.validation is not None and not self.config.validation.search(token)):
            return self._refuse("UNAUTHORIZED")
        method_arn = f"arn:aws:execute-api:us-east-1:000000000000:local/v1/{method}{path}"
        started = time.monotonic()
        try:
            answer = self.authorizer(
                {"type": "TOKEN", "authorizationToken": token, "methodArn": method_arn}, self.context()
            )
        except Exception as exc:
            if str(exc) == "Unauthorized":
                return self._refuse("UNAUTHORIZED")
            log.exception("authorizer failed")
            return self._refuse("AUTHORIZER_FAILURE")
        if not _allows(answer.get("policyDocument") or {}, method_arn):
            return self._refuse("ACCESS_DENIED")
        return {
            **(answer.get("context") or {}),
            "principalId": answer["principalId"],
            "integrationLatency": int((time.monotonic() - started) * 1000),
        }


def _allows(policy: dict, method_arn: str) -> bool:
    allowed = False
    for statement in policy.get("Statement") or []:
        resources = statement.get("Resource")
        resources = [resources] if isinstance(resources, str) else resources or []
        if any(fnmatch.fnmatchcase(method_arn, r) for r in resources):
            if statement.get("Effect") == "Deny":
                return False
            allowed = allowed or statement.get("Effect") == "Allow"
    return allowed


class JwtGate:
    """The HTTP API's JWT authorizer (FrontDoor http): the token from `Authorization: Bearer <jwt>`, its signature
    against the issuer's JWKS, its issuer, its audience (`aud`, else `client_id`, among the app clients), its expiry
    and not-before. Refused: 401 {"message":"Unauthorized"} (an HTTP API has no gateway responses to reshape it);
    admitted: the claims as the function gets them (every value as text) and the token's scopes. Routes whose event
    says `Auth: {Authorizer: NONE}` are public."""

    def __init__(self, issuer: str, jwks_url: str, audience: set[str], public_routes: set[tuple[str, str]]):
        import jwt

        self.issuer, self.audience, self.public_routes = issuer, audience, public_routes
        self.jwks = jwt.PyJWKClient(jwks_url, cache_keys=True)

    def admit(self, method: str, path: str, headers: dict) -> Refused | dict | None:
        """Refused, the JWT context for the function, or None on a public route."""
        import jwt

        from infra.dev_issuer import api_gateway_claims

        if (method, path) in self.public_routes:
            return None
        value = next((v for name, v in headers.items() if name.lower() == "authorization"), "")
        token = value.removeprefix("Bearer ").strip()
        try:
            key = self.jwks.get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key.key, algorithms=["RS256"], issuer=self.issuer, options={"verify_aud": False})
        except jwt.PyJWTError:
            return Refused(401, '{"message":"Unauthorized"}')
        if str(claims.get("aud") or claims.get("client_id")) not in self.audience:
            return Refused(401, '{"message":"Unauthorized"}')
        return api_gateway_claims(claims)
