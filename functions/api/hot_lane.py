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
        routes: list[Route] = [*app._static_routes, *app._dynamic_routes]
        # only the routes up to the last hot one can be the first match of a hot route's request; the resolver skips
        # the other methods' routes one by one, here they are left out once
        last = max((i for i, r in enumerate(routes) if (r.method, r.path) in hot_paths), default=-1)
        self.routes: dict[str, list[Route]] = {}
        for route in routes[: last + 1]:
            self.routes.setdefault(route.method, []).append(route)
        self.hot: dict[int, tuple[RouteArgs, Rule]] = {
            id(route): (RouteArgs(f"{route.method} {route.path}", route.dependant), authorization.rules()[key])
            for route in routes
            if (key := (route.method, route.path)) in hot_paths
        }

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
        for route in self.routes.get(method, ()):
            matched = route.rule.match(path)
            if matched is not None:
                break
        else:
            return None
        hot = self.hot.get(id(route))
        if hot is None:
            return None
        route_args, rule = hot
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
