"""Who may call what, pinned as one table (issue 35, class 1): every operation of the OpenAPI document (and the two
public routes) driven with every kind of caller through the real entry point, as API Gateway runs it: the bearer
token goes through the template's Lambda authorizer (functions/authorizer, against the local dev issuer's key set)
and the gateway's responses (infra/localrt/gateway.py), then the API function's handler with the authorizer's context.

Each (route, caller) pair has its exact answer: status and error code. A caller a route admits gets the route's own
answer to a valid request (each made against entities of its own where a first call would change the second's);
anyone else gets 401 UNAUTHENTICATED (no token, or a token of another audience: an app client the authorizer does
not accept), 403 FORBIDDEN (a client holding only another resource server's scopes, or scopes without the
resource server's prefix, holds none of the API's), or, for another user's entity named by id, the answer for a
missing one. A route in
the document and not in the table fails the test, as does a table line for a route the document lost."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

import pytest

from helpers import REPO, Api, invoke_writer, ledger_records
from infra import dev_issuer
from infra.localrt import events, gateway, template

NONE, OWNER, OTHER, SERVICE, OPERATOR, AUDIENCE, FOREIGN = (
    "no token",
    "owner",
    "another user",
    "service",
    "operator",
    "another audience",
    "another resource server's scopes",
)
CALLERS = (NONE, OWNER, OTHER, SERVICE, OPERATOR, AUDIENCE, FOREIGN)
S, OP, U = SERVICE, OPERATOR, OWNER
ANY_TOKEN = frozenset({S, OP, U, OTHER, FOREIGN})


@dataclass(frozen=True)
class Line:
    """A route's line: who it admits, the status an admitted caller's valid request gets; `params` names the
    entities it acts on (keys of the world: a callable is called again for each call, an entity of its own)."""

    admits: frozenset[str]
    status: int
    body: object = None
    query: str = ""
    params: dict = field(default_factory=dict)
    hidden: bool | str = False  # another user's entity named by id answers as a missing one (404; a str: its code)
    code: str | None = None  # the error code of an admitted caller's answer, when it is a refusal of the route's own


def line(admits, status, body=None, query="", hidden=False, code=None, **params) -> Line:
    return Line(frozenset(admits), status, body, query, params, hidden, code)


PUBLIC = {("GET", "/openapi.json"), ("GET", "/swagger")}
# written out from docs/api.md's "Who may call what", independently of the routes' RULES
TABLE: dict[tuple[str, str], Line] = {
    # accounts and the ledger
    ("POST", "/accounts"): line({OP}, 201, body="new_account"),
    ("GET", "/accounts/{user_id}"): line({S, OP, U}, 200),
    ("PATCH", "/accounts/{user_id}"): line({OP}, 200, body={"threshold": "0.00"}),
    ("POST", "/accounts/{user_id}/recharge"): line({S}, 200, body={"amount": "1.00"}),
    ("POST", "/accounts/{user_id}/deduct"): line({S}, 200, body={"amount": "1.00"}),
    ("GET", "/accounts/{user_id}/orders/{order_id}"): line({S, OP, U}, 200),
    # holds
    ("GET", "/accounts/{user_id}/holds"): line({S, OP, U}, 200),
    ("POST", "/accounts/{user_id}/holds"): line({S}, 201, body={"amount": "1.00"}),
    ("POST", "/accounts/{user_id}/holds/{hold_id}/capture"): line({S}, 200, body={"amount": "0.01"}),
    ("POST", "/accounts/{user_id}/holds/{hold_id}/void"): line({S}, 200, hold_id="void_hold"),
    ("GET", "/accounts/{user_id}/holds/{hold_id}"): line({S, OP, U}, 200),
    # refunds
    ("POST", "/accounts/{user_id}/orders/{order_id}/refunds"): line({S}, 201, body={"amount": "0.01"}),
    ("POST", "/accounts/{user_id}/holds/{hold_id}/refunds"): line(
        {S}, 201, body={"amount": "0.01"}, hold_id="captured_hold"
    ),
    # history
    ("GET", "/accounts/{user_id}/entries"): line({S, OP, U}, 200),
    ("GET", "/accounts/{user_id}/balance"): line({S, OP, U}, 200, query="at=0"),
    ("GET", "/accounts/{user_id}/statement"): line({S, OP, U}, 200, query="since=0&until=1"),
    # vouchers
    ("POST", "/vouchers"): line({OP}, 201, body={"title": "t", "stock": 1, "begin_at": 0, "end_at": 4102444800000}),
    ("GET", "/vouchers/{voucher_id}"): line(ANY_TOKEN, 200),
    ("POST", "/vouchers/{voucher_id}/orders"): line({S, U}, 200, body="for_alice"),
    ("GET", "/vouchers/{voucher_id}/orders/{order_id}"): line({S, OP, U}, 200, hidden=True, order_id="voucher_order"),
    # red packets
    ("POST", "/redpackets"): line({S}, 201, body="packet_of_alice"),
    ("POST", "/redpackets/{packet_id}/grab"): line({S, U}, 200, body="for_alice", packet_id="fresh_packet"),
    ("GET", "/redpackets/{packet_id}"): line(ANY_TOKEN, 200),
    # payment orders
    ("POST", "/orders"): line({S}, 201, body={"user_id": "alice", "amount": "1.00", "close_in_s": 3600}),
    # transfers: a service's, or an end user's from their own account; read by the payer, services and operators
    ("POST", "/transfers"): line({S, U}, 201, body="transfer_from_alice"),
    ("GET", "/transfers/{transfer_id}"): line({S, OP, U}, 200, hidden="TRANSFER_NOT_FOUND"),
    ("GET", "/orders/{order_id}"): line({S, OP, U}, 200, hidden=True, order_id="payment_order"),
    ("POST", "/orders/{order_id}/pay"): line({S, U}, 200, hidden=True, order_id="fresh_payment_order"),
    ("POST", "/orders/{order_id}/close"): line({S}, 200, order_id="fresh_payment_order"),
    # delay queues: the backend's; their dead letters the operators'
    ("POST", "/delay-queues/{queue}/items"): line({S}, 200, body={"element": "e1", "delay_s": 0}),
    ("DELETE", "/delay-queues/{queue}/items/{element}"): line({S}, 200, element="fresh_element"),
    ("GET", "/delay-queues/{queue}"): line({S, OP}, 200),
    ("POST", "/delay-queues/{queue}/take"): line({S}, 200, body={"limit": 1}),
    ("POST", "/delay-queues/{queue}/ack"): line({S}, 200, body={"receipts": ["1:e1"]}),
    ("POST", "/delay-queues/{queue}/extend"): line({S}, 200, body={"receipts": ["1:e1"], "visibility_ms": 1000}),
    ("GET", "/delay-queues/{queue}/dead-letters"): line({OP}, 200),
    ("POST", "/delay-queues/{queue}/dead-letters/replay"): line({OP}, 200, body={"elements": ["e1"]}),
    ("DELETE", "/delay-queues/{queue}/dead-letters/{element}"): line({OP}, 404, code="ELEMENT_NOT_FOUND"),  # none there
    # the inbox and journeys
    ("GET", "/inbox/{account}/messages"): line({S, U}, 200),
    ("POST", "/inbox/{account}/messages"): line(
        {S}, 200, body={"biz_type": "b", "outer_biz_id": "o1", "title": "t", "content": "c"}
    ),
    ("POST", "/journeys/{biz}/{account}/start"): line({S}, 200),
    ("POST", "/journeys/{biz}/{account}/finish"): line({S}, 200),
    # webhook endpoints: the backend's and the operators'
    ("GET", "/webhook-endpoints"): line({S, OP}, 200),
    ("POST", "/webhook-endpoints"): line({S, OP}, 201, body="endpoint"),
    ("GET", "/webhook-endpoints/{endpoint_id}"): line({S, OP}, 200),
    ("DELETE", "/webhook-endpoints/{endpoint_id}"): line({S, OP}, 204, endpoint_id="fresh_endpoint"),
    ("PATCH", "/webhook-endpoints/{endpoint_id}"): line({S, OP}, 200, body={"description": "d"}),
    ("POST", "/webhook-endpoints/{endpoint_id}/rotate-secret"): line({S, OP}, 200, body={}),
    ("GET", "/webhook-endpoints/{endpoint_id}/deliveries"): line({S, OP}, 200),
    ("POST", "/webhook-endpoints/{endpoint_id}/replay"): line({S, OP}, 200, body={}),
    # balance monitors
    ("GET", "/accounts/{user_id}/monitors"): line({S, OP, U}, 200),
    ("POST", "/accounts/{user_id}/monitors"): line({S, OP, U}, 201, body={"below": "1.00"}),
    ("DELETE", "/accounts/{user_id}/monitors/{monitor_id}"): line({S, OP, U}, 204, monitor_id="fresh_monitor"),
    # operations
    ("GET", "/ops/accounts/{user_id}"): line({OP}, 200),
    ("POST", "/ops/accounts/{user_id}/adjustments"): line({OP}, 200, body={"amount": "1.00", "reason": "goodwill"}),
    ("GET", "/ops/dead-letters"): line({OP}, 200),
    ("POST", "/ops/dead-letters/replay"): line({OP}, 200, body={"source": "stream", "ids": ["0:1-1"]}),
    ("GET", "/ops/reconciler"): line({OP}, 200),
    ("GET", "/ops/log"): line({OP}, 200),
    # an operator admitted: the local runtime has no sealing key
    ("POST", "/ops/webhook-secrets/seal"): line({OP}, 409, code="NO_SEALING_KEY"),
    # the API's own description: no token needed
    ("GET", "/openapi.json"): line(set(CALLERS), 200),
    ("GET", "/swagger"): line(set(CALLERS), 200),
}


def expected(route: tuple[str, str], caller: str) -> tuple[int, str | None]:
    """The exact (status, error code) of a caller's valid request to a route."""
    entry = TABLE[route]
    if caller in entry.admits:
        return entry.status, entry.code
    if caller in (NONE, AUDIENCE):
        return 401, "UNAUTHENTICATED"
    if caller == OTHER and entry.hidden:  # another user's: as if it did not exist (True: an order)
        return 404, entry.hidden if isinstance(entry.hidden, str) else "ORDER_NOT_FOUND"
    return 403, "FORBIDDEN"


@pytest.fixture(scope="module")
def through_the_gateway():
    """call(method, path, body, token) -> (status, JSON body): the local gateway with the template's authorizer
    function (configured for the dev issuer, whose key set is served over HTTP as Cognito serves it), then the API
    function's handler with the authorizer's context, as API Gateway invokes them."""
    from authorizer import app as authorizer_app

    from api.app import handler

    issuer = dev_issuer.JwksServer().serve_in_thread()
    saved = authorizer_app._verifier
    authorizer_app._verifier = authorizer_app.Verifier(
        authorizer_app.Settings(
            issuer=dev_issuer.ISSUER, jwks_url=issuer.url, client_ids=frozenset({dev_issuer.CLIENT_ID})
        )
    )
    config = template.api_authorizer(REPO / "template.yaml")
    api_function = next(f for f in template.load(REPO / "template.yaml") if f.name == "ApiFunction")
    gate = gateway.Gate(
        config, authorizer_app.handler, api_function.public_routes, lambda: events.LambdaContext("AuthorizerFunction")
    )

    def call(method: str, path: str, body, token: str | None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        path, _, query = path.partition("?")
        admitted = gate.admit(method, path, headers)
        if isinstance(admitted, gateway.Refused):
            return admitted.status, json.loads(admitted.body)
        text = json.dumps(body) if body is not None else None
        response = handler(
            events.api_gateway_proxy(method, path, text, headers, query, authorizer=admitted),
            events.LambdaContext("ApiFunction"),
        )
        answer = response["body"]
        return response["statusCode"], json.loads(answer) if answer.startswith(("{", "[")) else answer

    yield call
    authorizer_app._verifier = saved
    issuer.shutdown()


def _world(api, receiver, redis_client) -> dict:
    """alice's entities every route can name (bob: another user, the red packets' sender), and factories of fresh
    ones for the routes whose first call would change what a second gets. Charges are booked by the writer (only a
    booked charge is refundable); webhook endpoints are a service's (an operator's may be changed by operators only)."""
    alice, bob = api.account(balance="100.00"), api.account(balance="100.00")

    def booked():
        assert invoke_writer(ledger_records(redis_client, [alice])) == {"batchItemFailures": []}

    voucher = api(
        "POST",
        "/vouchers",
        {"title": "t", "stock": 50, "begin_at": 0, "end_at": 4102444800000, "per_user_limit": 50},
    )[1]["voucher_id"]

    def hold(captured=False):
        hold_id = api("POST", f"/accounts/{alice}/holds", {"amount": "2.00"})[1]["hold_id"]
        if captured:  # and ended: what a hold captured is refunded once it ended
            assert api("POST", f"/accounts/{alice}/holds/{hold_id}/capture", {"amount": "1.00"})[0] == 200
            assert api("POST", f"/accounts/{alice}/holds/{hold_id}/void")[0] == 200
            booked()
        return hold_id

    def packet():
        status, body = api("POST", "/redpackets", {"sender_id": bob, "total": "1.00", "count": 1, "expires_in_s": 600})
        assert status == 201, body
        return body["packet_id"]

    def payment_order():
        status, body = api("POST", "/orders", {"user_id": alice, "amount": "1.00", "close_in_s": 3600})
        assert status == 201, body
        return body["order_id"]

    def endpoint():
        status, body = Api(scopes=("service",))(
            "POST", "/webhook-endpoints", {"url": receiver.url, "event_types": ["charge.persisted"]}
        )
        assert status == 201, body
        return body["endpoint_id"]

    def monitor():
        status, body = api("POST", f"/accounts/{alice}/monitors", {"below": "1.00"})
        assert status == 201, body
        return body["monitor_id"]

    queue = f"rules-{uuid.uuid4().hex[:8]}"

    def element():
        name = f"e-{uuid.uuid4().hex[:8]}"
        assert api("POST", f"/delay-queues/{queue}/items", {"element": name, "delay_s": 600})[0] == 200
        return name

    order_id = api("POST", f"/accounts/{alice}/deduct", {"amount": "1.00"})[1]["order_id"]
    booked()
    return {
        "user_id": alice,
        "account": alice,
        "alice": alice,
        "bob": bob,
        "order_id": order_id,
        "hold_id": hold(),
        "void_hold": hold,
        "captured_hold": lambda: hold(captured=True),
        "voucher_id": voucher,
        "voucher_order": api("POST", f"/vouchers/{voucher}/orders", {"user_id": alice})[1]["order_id"],
        "packet_id": packet(),
        "fresh_packet": packet,
        "payment_order": payment_order(),
        "fresh_payment_order": payment_order,
        "transfer_id": api("POST", "/transfers", {"from": alice, "to": bob, "amount": "0.01"})[1]["transfer_id"],
        "endpoint_id": endpoint(),
        "fresh_endpoint": endpoint,
        "monitor_id": monitor(),
        "fresh_monitor": monitor,
        "queue": queue,
        "element": "e1",
        "fresh_element": element,
        "biz": "password-recovery",
    }


def _request(route: tuple[str, str], world: dict) -> tuple[str, object]:
    """The route's path with the world's entities (fresh ones made now) and its valid body."""
    method, path = route
    entry = TABLE[route]

    def value(name: str):
        chosen = world[entry.params.get(name, name)]
        return chosen() if callable(chosen) else chosen

    path = re.sub(r"\{(\w+)\}", lambda m: str(value(m.group(1))), path) + (f"?{entry.query}" if entry.query else "")
    bodies = {
        "new_account": lambda: {"user_name": f"rules-{uuid.uuid4().hex[:12]}"},
        "for_alice": lambda: {"user_id": world["alice"]},
        "transfer_from_alice": lambda: {"from": world["alice"], "to": world["bob"], "amount": "0.01"},
        "packet_of_alice": lambda: {"sender_id": world["alice"], "total": "1.00", "count": 1},
        "endpoint": lambda: {"url": world["receiver"].url, "event_types": ["charge.persisted"]},
    }
    body = entry.body
    if isinstance(body, str):
        body = bodies[body]()
    elif isinstance(body, dict):
        body = {k: world["alice"] if v == "alice" else v for k, v in body.items()}
    return path, body


def test_every_route_of_the_document_with_every_kind_of_caller(api, local_hooks, through_the_gateway, redis_client):
    from api.app import openapi_json

    document = json.loads(openapi_json())
    routes = {(method.upper(), path) for path, operations in document["paths"].items() for method in operations}
    assert len(routes) >= 50
    assert set(TABLE) == routes | PUBLIC, (
        f"routes without a table line: {sorted(routes | PUBLIC - set(TABLE))}; "
        f"lines without a route: {sorted(set(TABLE) - routes - PUBLIC)}"
    )
    receiver = local_hooks()
    world = {**_world(api, receiver, redis_client), "receiver": receiver}
    tokens = {
        NONE: None,
        OWNER: dev_issuer.token(world["alice"]),
        OTHER: dev_issuer.token(world["bob"]),
        SERVICE: dev_issuer.token(scopes=("service",)),
        OPERATOR: dev_issuer.token(scopes=("admin",)),
        # every scope, signed by the issuer, but for an app client the API does not accept
        AUDIENCE: dev_issuer.token(scopes=("service", "admin"), client_id="another-app"),
        # an accepted client whose scopes are not this resource server's (`hotledger/...`): authenticated, no scope
        FOREIGN: dev_issuer.token(scope="service admin other-api/service other-api/admin"),
    }
    wrong = []
    for route in sorted(TABLE):
        for caller in CALLERS:
            path, body = _request(route, world)
            status, answer = through_the_gateway(route[0], path, body, tokens[caller])
            code = answer["error"]["code"] if isinstance(answer, dict) and "error" in answer else None
            if (status, code) != expected(route, caller):
                wrong.append((route, caller, (status, code), expected(route, caller), answer))
    # the endpoints this test made (and the calls above made) would receive the later tests' events: gone
    for endpoint in api("GET", "/webhook-endpoints")[1]:
        if endpoint["url"] == receiver.url:
            api("DELETE", f"/webhook-endpoints/{endpoint['endpoint_id']}")
    assert wrong == [], "\n".join(map(repr, wrong))
