"""A verified Cognito token's claims -> the caller: shared by the Lambda authorizer (REST front door), which verifies the
token itself, and the API function behind the HTTP API's JWT authorizer, which reads the claims API Gateway verified
(requestContext.authorizer.jwt.claims: every value a string there, a list as "[a b]")."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SCOPES = ("service", "admin")
_ACCOUNT_ID = re.compile(r"[1-9][0-9]{0,9}")
_ACCOUNT_ID_LIMIT = 2**31  # the API's account ids are below 2**31


class InvalidToken(Exception):
    """The caller is not authenticated: answered 401 UNAUTHENTICATED."""


@dataclass(frozen=True)
class Caller:
    principal: str
    kind: str  # "user" (a username) or "client" (client credentials)
    user_id: int | None
    scopes: frozenset[str]
    expires_at: int

    def context(self) -> dict[str, str | int]:
        """Authorizer context values must be strings, numbers or booleans."""
        return {
            "kind": self.kind,
            "user_id": "" if self.user_id is None else str(self.user_id),
            "scopes": " ".join(sorted(self.scopes)),
            "expires_at": self.expires_at,
        }


def _groups(claim: Any) -> list[str]:
    """cognito:groups: a list in the token, the text "[admin ops]" in the HTTP API's claims."""
    if isinstance(claim, str):
        return claim.strip().removeprefix("[").removesuffix("]").replace(",", " ").split()
    return [str(group) for group in claim or []]


def caller_of_claims(claims: Mapping[str, Any], scope_prefix: str, admin_group: str) -> tuple[str | None, Caller]:
    """The token's app client and the caller it names; InvalidToken for a token that is neither an access nor an ID
    token, or without a subject or expiry."""
    if claims.get("token_use") == "access":
        client, username = claims.get("client_id"), claims.get("username")
    elif claims.get("token_use") == "id":
        client, username = claims.get("aud"), claims.get("cognito:username")
    else:
        raise InvalidToken(f"token_use {claims.get('token_use')!r} is neither access nor id")
    expires_at = str(claims.get("exp") or "")
    if not claims.get("sub") or not expires_at.isdigit():
        raise InvalidToken("the token names no subject or expiry")
    scopes = {s.removeprefix(scope_prefix) for s in str(claims.get("scope", "")).split() if s.startswith(scope_prefix)}
    if admin_group in _groups(claims.get("cognito:groups")):
        scopes.add("admin")
    user_id = None
    if isinstance(username, str) and _ACCOUNT_ID.fullmatch(username) and int(username) < _ACCOUNT_ID_LIMIT:
        user_id = int(username)
    caller = Caller(
        principal=str(claims["sub"]),
        kind="user" if username else "client",
        user_id=user_id,
        scopes=frozenset(scopes) & frozenset(SCOPES),
        expires_at=int(expires_at),
    )
    return (str(client) if client is not None else None), caller
