"""The hot routes' arguments (path, headers, JSON body) validated in one precompiled step.

Powertools' request validator (OpenAPIRequestValidationMiddleware) takes generic passes per request: it normalizes
and validates path, query, header and cookie parameters and the body one kind at a time, inspecting each field's
annotation again. For the routes every charge takes, one pydantic model of all their parameters, built from the
route's own declarations once per container, validates them in one call. Only plain requests take this step: each
header at most once, a JSON body that is not base64-encoded, Content-Type absent or application/json. Anything else,
and anything the model refuses, goes the generic way, so every refusal is the validator's own (the same codes and
messages); what the step accepts, the generic passes accept with the same values."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ValidationError, create_model

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler.openapi.params import Dependant
    from pydantic.fields import FieldInfo

_JSON = "application/json"


class RouteArgs:
    """The validated arguments of one route (its dependant: Powertools' parameters of the route function)."""

    def __init__(self, name: str, dependant: Dependant) -> None:
        if dependant.query_params or dependant.cookie_params or len(dependant.body_params) > 1:
            raise ValueError(f"{name}: only path and header parameters and one JSON body are validated in one step")
        fields = [*dependant.path_params, *dependant.header_params, *dependant.body_params]
        # each field as the validator checks it on its own (its type and constraints); keyed by the field's name.
        # (type form, default) pairs, typed Any: mypy checks a **-unpacked dict's values against every keyword
        # parameter of create_model (__config__, __base__, ...), not only **field_definitions
        definitions: dict[str, Any] = {
            f.name: (_checked(f.field_info), ... if f.required else f.default) for f in fields
        }
        self.model: type[BaseModel] = create_model(f"{name}_args", **definitions)
        self.path = [(f.name, f.alias) for f in dependant.path_params]
        self.headers = [(f.name, f.alias.lower()) for f in dependant.header_params]
        self.body = dependant.body_params[0].name if dependant.body_params else None

    def parse(self, event: dict[str, Any], route_args: dict[str, str]) -> dict[str, Any] | None:
        """The route function's arguments by name, or None: the request takes the generic passes."""
        raw: dict[str, Any] = {name: route_args[alias] for name, alias in self.path}
        headers = _plain_headers(event)
        if headers is None:
            return None
        for name, lowered in self.headers:
            if lowered in headers:
                raw[name] = headers[lowered]
        if self.body is not None:
            body = event.get("body")
            content_type = _content_type(event)
            if (
                not body
                or event.get("isBase64Encoded")
                or content_type is None
                or (content_type and not content_type.startswith(_JSON))
            ):
                return None
            try:
                raw[self.body] = json.loads(body)
            except ValueError:
                return None
        try:
            return dict(self.model.model_validate(raw).__dict__)
        except ValidationError:
            return None


def _checked(field_info: FieldInfo) -> Any:
    """The field's type with its constraints (gt, pattern, ...: pydantic keeps them in `metadata`)."""
    if not field_info.metadata:
        return field_info.annotation
    return Annotated[(field_info.annotation, *field_info.metadata)]


def _plain_headers(event: dict[str, Any]) -> dict[str, str] | None:
    """The request's headers by lower-cased name, as the validator reads them (multiValueHeaders when given, else
    headers), or None when one is given more than once (the validator's own rules decide those)."""
    multi = event.get("multiValueHeaders")
    found: dict[str, str] = {}
    if multi:
        for name, values in multi.items():
            lowered = name.lower()
            if lowered in found or not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], str):
                return None
            found[lowered] = values[0]
        return found
    for name, value in (event.get("headers") or {}).items():
        lowered = name.lower()
        if lowered in found or not isinstance(value, str):
            return None
        found[lowered] = value
    return found


def _content_type(event: dict[str, Any]) -> str | None:
    """Content-Type as the validator reads it (from headers, whatever multiValueHeaders says); None when it is
    there more than once."""
    given = [value for name, value in (event.get("headers") or {}).items() if name.lower() == "content-type"]
    if len(given) > 1:
        return None
    return (given[0] or "").strip() if given else ""
