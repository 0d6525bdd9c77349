"""The hot lane (api/hot_lane.py) takes a request for a hot route exactly when the resolver's first matching route is
that hot route: every route of the API, with paths made from its template, under every method, on both front doors;
and a route before a hot one that matches its paths keeps them (the resolver's)."""

from __future__ import annotations

import re

import pytest
from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from api.hot_lane import HotLane, may_share_a_path

# what a template's parameters are filled with: ids, text a parameter matches, text it does not
VALUES = ["1", "0", "2147483648", "abc", "a-b.c", "%20", "x y", "a/b", ""]
SUFFIXES = ["", "/", "//", "\n", "/x", "x"]
EXTRA_PATHS = [
    "/",
    "",
    "//",
    "/accounts",
    "/accounts/",
    "/accounts/1/deduct/1",
    "/ACCOUNTS/1/deduct",
    "/accounts//deduct",
]


def _lanes():
    from api import app

    return [("rest", app.app, app._rest_lane), ("http", app.http_app, app._http_lane)]


def _paths(templates) -> set[str]:
    paths = set(EXTRA_PATHS)
    for template in templates:
        for value in VALUES:
            filled = re.sub(r"<\w+>", value, template)
            paths.update(filled + suffix for suffix in SUFFIXES)
    return paths


def _resolvers_route(resolver, method: str, path: str):
    """The route the resolver takes the request to: the first whose rule matches (ApiGatewayResolver._resolve)."""
    for route in [*resolver._static_routes, *resolver._dynamic_routes]:
        if route.method == method and route.rule.match(path):
            return route
    return None


def _lanes_route(lane: HotLane, method: str, path: str):
    found = lane.route_of(method, path)
    return None if found is None else found[0]


@pytest.mark.parametrize("front_door", ["rest", "http"])
def test_every_route_is_taken_by_the_lane_exactly_when_the_resolver_takes_it_to_a_hot_route(front_door):
    _, resolver, lane = next(found for found in _lanes() if found[0] == front_door)
    routes = [*resolver._static_routes, *resolver._dynamic_routes]
    methods = {route.method for route in routes} | {"PUT", "HEAD", "OPTIONS"}
    taken = 0
    for path in sorted(_paths(route.path for route in routes)):
        for method in sorted(methods):
            first = _resolvers_route(resolver, method, path)
            expected = first if first is not None and id(first) in lane.hot else None
            assert _lanes_route(lane, method, path) is expected, (method, path)
            taken += expected is not None
    assert taken >= len(lane.hot) * 4  # the hot routes' own paths were among them


@pytest.mark.parametrize("earlier", ["/accounts/<user_id>/<what>", "/accounts/7/deduct", "/accounts/<a>/de.uct"])
def test_a_route_before_a_hot_one_that_matches_its_path_keeps_the_request(earlier):
    from hotledger.ledger import routes as ledger_routes

    resolver = APIGatewayRestResolver(enable_validation=True)
    resolver.post(earlier)(lambda **kwargs: {})
    resolver.include_router(ledger_routes.router)
    lane = HotLane(resolver, ledger_routes.HOT_ROUTES)
    assert _resolvers_route(resolver, "POST", "/accounts/7/deduct").path == earlier
    for path in ("/accounts/7/deduct", "/accounts/8/deduct", "/accounts/8/recharge"):
        first = _resolvers_route(resolver, "POST", path)
        expected = first if id(first) in lane.hot else None
        assert _lanes_route(lane, "POST", path) is expected, path


@pytest.mark.parametrize(
    ("template", "other", "may"),
    [
        ("/accounts/<user_id>/deduct", "/accounts/<user_id>/recharge", False),
        ("/accounts/<user_id>/deduct", "/accounts/<id>/deduct", True),
        ("/accounts/<user_id>/deduct", "/accounts/<user_id>/<what>", True),
        ("/accounts/<user_id>/deduct", "/accounts/<user_id>", False),
        ("/accounts/<user_id>/deduct", "/accounts", False),
        ("/accounts/<user_id>/deduct", "/vouchers/<voucher_id>/orders", False),
        ("/accounts/<user_id>/deduct", "/accounts/1/deduct", True),
        ("/accounts/<user_id>/deduct", "/accounts/<user_id>/de.uct", True),  # '.' matches any character
        ("/accounts/<user_id>/deduct", "/openapi.json", True),
        ("/accounts/<user_id>/deduct", "/accounts/<user_id>/", True),  # an empty segment
        ("/accounts/<user_id>/deduct", "/accounts/v<user_id>/deduct", True),  # a parameter within text
        ("/accounts/<user_id>/deduct", "accounts/<user_id>/deduct", True),
    ],
)
def test_two_templates_may_share_a_path_unless_their_segments_differ_in_number_or_in_a_literal(template, other, may):
    assert may_share_a_path(template, other) is may
    assert may_share_a_path(other, template) is may
