"""The hot routes (every charge: deduct, recharge) answered without the resolver's generic per-request machinery.

Powertools' resolver, for any request, wraps the event, walks the middleware stack (frames, kwargs, a processed-stack
record per layer), runs the request validator's passes and writes debug lines that are filtered out. For a request
that takes a hot route and is plain, this lane does only what that request needs, with the resolver's own parts:
its routes in its order and their compiled rules (the same route matches), the route's rule (api.authorization),
the route's one-step validation (api.route_args), the route function, the resolver's exception handlers and its
ResponseBuilder. So the answer is the resolver's answer, byte for byte (tests/integration/test_hot_lane.py).

A request the lane does not take returns None before anything ran, and the resolver takes it: another route, no
caller or one the rule refuses, an end user's ownership to check, arguments the one-step validation sends the generic
way. Every refusal before the route runs stays the resolver's own."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver, BaseRouter, Route

from api import authorization
from api.route_args import RouteArgs
from api.rules import Rule
from hotledger import errors

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler.api_gateway import ResponseBuilder
    from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent
    from aws_lambda_powertools.utilities.typing import LambdaContext


class HotLane:
    def __init__(self, app: ApiGatewayResolver, hot_paths: set[tuple[str, str]]) -> None:
        self.app = app
        routes: list[Route] = [*app._static_routes, *app._dynamic_routes]  # the resolver's order: first match wins
        # per method, each hot route with the routes before it that may match a path of its own: a request matching
        # none of those takes the hot route, as in the resolver, with one regex per hot route instead of one per route
        # before it
        self.routes: dict[str, list[tuple[Route, list[Route]]]] = {}
        for i, route in enumerate(routes):
            if (route.method, route.path) in hot_paths:
                before = [r for r in routes[:i] if r.method == route.method and may_share_a_path(r.path, route.path)]
                self.routes.setdefault(route.method, []).append((route, before))
        self.hot: dict[int, tuple[RouteArgs, Rule]] = {
            id(route): (RouteArgs(f"{route.method} {route.path}", route.dependant), authorization.rules()[key])
            for route in routes
            if (key := (route.method, route.path)) in hot_paths
        }

    def route_of(self, method: str, path: str) -> tuple[Route, re.Match[str]] | None:
        """The hot route the resolver matches first for this request and its match, or None: the resolver takes it (a
        route that is not hot, or none)."""
        for route, before in self.routes.get(method, ()):
            matched = route.rule.match(path)
            if matched is not None:
                if any(other.rule.match(path) for other in before):
                    return None
                return route, matched
        return None

    def answer(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any] | None:
        """The resolver's answer to a plain request of a hot route, or None: the resolver takes the request."""
        app = self.app
        request = app._to_proxy_event(event)  # the resolver's own view of its payload format (REST v1, HTTP API v2)
        try:
            method, path = request.http_method, request.path
        except (KeyError, TypeError):
            return None
        if not isinstance(method, str) or not isinstance(path, str):
            return None
        method, path = method.upper(), app._remove_prefix(path)
        found = self.route_of(method, path)
        if found is None:
            return None
        route, matched = found
        route_args, rule = self.hot[id(route)]
        args = self._admitted_args(event, route_args, rule, app._convert_matches_into_route_keys(matched))
        if args is None:
            return None
        BaseRouter.current_event = request
        BaseRouter.lambda_context = context
        app.context.update(_route=route, _path=path, _route_args=args)  # what app.append_context does (untyped)
        try:
            return self._built(self._call(route, args))
        finally:
            app.context.clear()  # app.clear_context

    def _built(self, builder: ResponseBuilder[BaseProxyEvent]) -> dict[str, Any]:
        """The answer ResponseBuilder.build makes. A plain answer (a text body, no CORS, cache control or compression
        asked of it: the route's or the answer's) is put together here, its headers by the request's own serializer
        (multiValueHeaders for REST, headers and cookies for the HTTP API): the builder reads the request's
        Accept-Encoding through a case-insensitive map of every header first, to learn no more than that its
        answer is not compressed."""
        route, response = builder.route, builder.response
        if (
            route is None
            or route.cors
            or route.cache_control
            or route.compress
            or response.compress is not None
            or not isinstance(response.body, str)
            or response.cookies
        ):
            return self.app._build_response(builder)
        return {
            "statusCode": response.status_code,
            "body": response.body,
            "isBase64Encoded": response.base64_encoded,
            **BaseRouter.current_event.header_serializer().serialize(headers=response.headers, cookies=[]),
        }

    @staticmethod
    def _admitted_args(
        event: dict[str, Any], route_args: RouteArgs, rule: Rule, path_args: dict[str, str]
    ) -> dict[str, Any] | None:
        try:
            owner_check = authorization.admit_caller(rule, authorization.authorizer_context(event))
        except errors.DomainError:
            return None  # the resolver refuses it, in its own words
        if owner_check is not None:
            return None  # an end user acting on their own account: the resolver checks the owner
        return route_args.parse(event, path_args)

    def _call(self, route: Route, args: dict[str, Any]) -> ResponseBuilder[BaseProxyEvent]:
        app = self.app
        try:
            result = route.func(**args)
        except Exception as exc:
            handled = app._call_exception_handler(exc, route)
            if handled is None:
                raise
            return handled
        # _to_response may give a BedrockResponse (the Bedrock resolver's), which ResponseBuilder's type does not name;
        # Powertools ignores the same arg-type where it builds one (ApiGatewayResolver._call_route)
        return app._response_builder_class(
            response=app._to_response(result),  # type: ignore[arg-type]
            serializer=app._serializer,
            route=route,
        )


# a path parameter of a route template (Powertools' _DYNAMIC_ROUTE_PATTERN), alone in its segment; it matches one
# segment, never a '/'
_PARAMETER = re.compile(r"<\w+>")
# a literal segment that its rule's regex matches as itself and only itself (Powertools does not escape templates)
_LITERAL = re.compile(r"[A-Za-z0-9_-]+")


def may_share_a_path(template: str, other: str) -> bool:
    """Whether some path may match both route templates' rules; False only when none can. Two templates of plain
    segments (literals or parameters) share a path only with as many segments, each the same literal or a parameter
    on one side. A template with another segment (an empty one, text a regex reads as a pattern, a parameter within
    text) may match paths of other shapes: it may share one with any."""
    root, *segments = template.split("/")
    other_root, *others = other.split("/")
    if root or other_root or not all(_PARAMETER.fullmatch(s) or _LITERAL.fullmatch(s) for s in (*segments, *others)):
        return True
    return len(segments) == len(others) and all(
        a == b or _PARAMETER.fullmatch(a) or _PARAMETER.fullmatch(b) for a, b in zip(segments, others, strict=True)
    )
