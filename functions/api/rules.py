"""Who may call a route, as data: each feature's routes module declares `RULES` ({(method, path): Rule}) with these;
api/authorization.py applies them (every route has exactly one rule)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SERVICE, ADMIN = "service", "admin"

OwnerOf = Callable[[dict[str, Any]], int]  # the account a request acts on, from the route's validated arguments


@dataclass(frozen=True)
class Rule:
    scopes: frozenset[str] = frozenset()  # a caller holding any of these may call the route
    owner: OwnerOf | None = None  # an end user may call it for this account when it is theirs
    public: bool = False  # no caller needed (the API's own description)
    anyone: bool = False  # any authenticated caller


@dataclass(frozen=True)
class HiddenOwner:
    """An owner rule whose entity, when another user's, answers as a missing one (no oracle): check_owner
    (api/authorization.py) raises `hidden_as(args)` instead of FORBIDDEN."""

    owner: OwnerOf
    hidden_as: Callable[[dict[str, Any]], Exception]

    def __call__(self, args: dict[str, Any]) -> int:
        return self.owner(args)


def path_arg(name: str) -> OwnerOf:
    return lambda args: args[name]


def body_field(field: str) -> OwnerOf:
    return lambda args: getattr(args["request"], field)


def only(*scopes: str, owner: OwnerOf | None = None) -> Rule:
    return Rule(scopes=frozenset(scopes), owner=owner)
