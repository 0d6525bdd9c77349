"""Callers act only as themselves, through the API handler with real Redis, DB and broker: an end user cannot read
or move another account's money (nor mint their own), a service cannot do what operators do; every refusal is 403
FORBIDDEN and changes nothing. The caller is the authorizer context API Gateway passes (tests/helpers.caller_context)."""

from __future__ import annotations

from decimal import Decimal

from helpers import Api, broker_records, invoke_writer


def _snapshot(api, sql, accounts, packet, voucher, payment_order) -> dict:
    return {
        "accounts": [api("GET", f"/accounts/{a}")[1] for a in accounts],
        "db": sql(
            "SELECT user_id, balance, version FROM t_account WHERE user_id IN %s ORDER BY user_id", (tuple(accounts),)
        ),
        "packet": api("GET", f"/redpackets/{packet}")[1],
        "voucher": api("GET", f"/vouchers/{voucher}")[1],
        "payment_order": api("GET", f"/orders/{payment_order}")[1],
    }


def test_an_end_user_cannot_read_or_move_another_accounts_money_and_nothing_changes(api, sql, own_topic):
    alice, bob = api.account(balance="50.00"), api.account(balance="50.00")
    bobs_order = api("POST", f"/accounts/{bob}/deduct", {"amount": "1.00"})[1]["order_id"]
    packet = api("POST", "/redpackets", {"sender_id": bob, "total": "2.00", "count": 2, "expires_in_s": 600})[1][
        "packet_id"
    ]
    voucher = api("POST", "/vouchers", {"title": "t", "stock": 5, "begin_at": 0, "end_at": 4102444800000})[1][
        "voucher_id"
    ]
    bobs_voucher_order = api("POST", f"/vouchers/{voucher}/orders", {"user_id": bob})[1]["order_id"]
    bobs_payment_order = api("POST", "/orders", {"user_id": bob, "amount": "3.00", "close_in_s": 3600})[1]["order_id"]
    as_alice = Api(user_id=alice, scopes=())
    before = _snapshot(api, sql, (alice, bob), packet, voucher, bobs_payment_order)

    for method, path, body in [
        ("GET", f"/accounts/{bob}", None),
        ("GET", f"/accounts/{bob}/orders/{bobs_order}", None),
        ("POST", f"/accounts/{bob}/deduct", {"amount": "1.00"}),
        ("POST", f"/accounts/{bob}/recharge", {"amount": "1.00"}),
        ("POST", f"/accounts/{alice}/recharge", {"amount": "1000.00"}),  # minting money for herself
        ("POST", f"/accounts/{alice}/deduct", {"amount": "1.00"}),
        ("POST", "/redpackets", {"sender_id": bob, "total": "10.00", "count": 1, "expires_in_s": 60}),
        ("POST", f"/redpackets/{packet}/grab", {"user_id": bob}),
        ("POST", f"/vouchers/{voucher}/orders", {"user_id": bob}),
        ("POST", f"/orders/{bobs_payment_order}/close", None),
        ("GET", f"/inbox/{bob}/messages", None),
        ("PATCH", f"/accounts/{alice}", {"threshold": "-100.00"}),
    ]:
        status, answer = as_alice(method, path, body)
        assert (status, answer["error"]["code"]) == (403, "FORBIDDEN"), (method, path, answer)
    # another user's order named by its id answers as a missing one: no id tells an end user whether it exists
    missing = 2**62
    for method, path in [
        ("GET", f"/vouchers/{voucher}/orders/{{}}"),
        ("GET", "/orders/{}"),
        ("POST", "/orders/{}/pay"),
    ]:
        others = as_alice(method, path.format(bobs_voucher_order if "vouchers" in path else bobs_payment_order))
        absent = as_alice(method, path.format(missing))
        assert others[0] == absent[0] == 404 and others[1]["error"]["code"] == absent[1]["error"]["code"], (
            path,
            others,
            absent,
        )
        assert others[1]["error"]["message"].replace(str(bobs_voucher_order), "?").replace(
            str(bobs_payment_order), "?"
        ) == absent[1]["error"]["message"].replace(str(missing), "?"), (others, absent)
    assert _snapshot(api, sql, (alice, bob), packet, voucher, bobs_payment_order) == before

    # as herself she may: read her account and orders, grab, order vouchers, pay her own payment order, read her inbox
    own_payment_order = api("POST", "/orders", {"user_id": alice, "amount": "5.00", "close_in_s": 3600})[1]["order_id"]
    status, grab = as_alice("POST", f"/redpackets/{packet}/grab", {"user_id": alice})
    assert status == 200 and grab["credit"] == "PENDING"
    assert as_alice("POST", f"/vouchers/{voucher}/orders", {"user_id": alice})[0] == 200
    assert as_alice("POST", f"/orders/{own_payment_order}/pay")[1]["state"] == "PAID"
    assert as_alice("GET", f"/orders/{own_payment_order}")[0] == 200
    assert as_alice("GET", f"/inbox/{alice}/messages")[0] == 200
    invoke_writer(broker_records())  # the claim reaches the DB: now the grab is credited
    account = as_alice("GET", f"/accounts/{alice}")[1]
    assert account["user_id"] == alice and Decimal(account["balance"]) == Decimal("45.00") + Decimal(grab["amount"])
    assert api("GET", f"/accounts/{bob}")[1]["balance"] == before["accounts"][1]["balance"]


def test_a_service_cannot_create_or_change_accounts_nor_reopen_what_an_operator_closed(api, sql):
    as_service = Api(scopes=("service",))
    user_id = api.account(balance="10.00")
    assert api("PATCH", f"/accounts/{user_id}", {"api_open": False})[1]["api_open"] is False  # the operator closes it
    counts = "SELECT (SELECT COUNT(*) FROM t_user), (SELECT COUNT(*) FROM t_seckill_voucher)"
    before = sql(counts)
    for method, path, body in [
        ("PATCH", f"/accounts/{user_id}", {"api_open": True}),
        ("PATCH", f"/accounts/{user_id}", {"threshold": "-5.00"}),
        ("POST", "/accounts", {"user_name": "by-a-service"}),
        ("POST", "/vouchers", {"title": "t", "stock": 5, "begin_at": 0, "end_at": 4102444800000}),
        ("POST", "/delay-queues/order-close/dead-letters/replay", {"elements": ["x"]}),
    ]:
        status, answer = as_service(method, path, body)
        assert (status, answer["error"]["code"]) == (403, "FORBIDDEN"), (method, path, answer)
    assert sql(counts) == before
    assert as_service("POST", f"/accounts/{user_id}/recharge", {"amount": "5.00"})[0] == 200  # its own work, allowed
    account = api("GET", f"/accounts/{user_id}")[1]
    assert account["api_open"] is False and account["threshold"] == "0.00"  # the recharge did not reopen it


def test_an_end_user_and_a_backend_never_share_idempotency_keys(api, monkeypatch):
    """Issue 19 item 10: the backend's keys for an account were the end user's too: a user taking a backend's
    (predictable) key made the backend's request 409 IDEMPOTENCY_KEY_REUSED, and a user could spend the scope's key
    quota for everyone on the account."""
    from hotledger import runtime

    alice = api.account(balance="10.00")
    voucher = api(
        "POST", "/vouchers", {"title": "t", "stock": 5, "begin_at": 0, "end_at": 4102444800000, "per_user_limit": 2}
    )[1]["voucher_id"]
    sender = api.account(balance="10.00")
    packet = api("POST", "/redpackets", {"sender_id": sender, "total": "2.00", "count": 2, "expires_in_s": 600})[1][
        "packet_id"
    ]
    as_alice = Api(user_id=alice, scopes=())
    predictable = {"Idempotency-Key": f"grab-{packet}-{alice}"}
    assert as_alice("POST", f"/vouchers/{voucher}/orders", {"user_id": alice}, predictable)[0] == 200
    status, body = api("POST", f"/redpackets/{packet}/grab", {"user_id": alice}, predictable)  # the backend's own
    assert status == 200, body
    # the quota: a user who spent hers leaves the backend's untouched
    monkeypatch.setattr(runtime.idempotency(), "max_keys", 2)  # each scope opened one key so far
    assert as_alice("POST", f"/vouchers/{voucher}/orders", {"user_id": alice}, {"Idempotency-Key": "second"})[0] == 200
    status, body = as_alice("POST", f"/vouchers/{voucher}/orders", {"user_id": alice}, {"Idempotency-Key": "third"})
    assert (status, body["error"]["code"]) == (429, "TOO_MANY_KEYS"), body
    status, body = api(
        "POST", "/redpackets", {"sender_id": alice, "total": "1.00", "count": 1}, {"Idempotency-Key": "the-backends"}
    )
    assert status == 201, body


# every route rule with every kind of caller (issue 19: close the class) ------------------------------------------
def _world(api) -> dict:
    """Entities every route can name, owned by alice (except bob's account): path parameters and request bodies."""
    alice, bob = api.account(balance="50.00"), api.account(balance="50.00")
    order_id = api("POST", f"/accounts/{alice}/deduct", {"amount": "1.00"})[1]["order_id"]
    voucher = api("POST", "/vouchers", {"title": "t", "stock": 50, "begin_at": 0, "end_at": 4102444800000})[1][
        "voucher_id"
    ]
    voucher_order = api("POST", f"/vouchers/{voucher}/orders", {"user_id": alice})[1]["order_id"]
    packet = api("POST", "/redpackets", {"sender_id": bob, "total": "5.00", "count": 5, "expires_in_s": 600})[1][
        "packet_id"
    ]
    payment_order = api("POST", "/orders", {"user_id": alice, "amount": "1.00", "close_in_s": 3600})[1]["order_id"]
    hold = api("POST", f"/accounts/{alice}/holds", {"amount": "2.00"})[1]["hold_id"]
    transfer = api("POST", "/transfers", {"from": alice, "to": bob, "amount": "1.00"})[1]["transfer_id"]
    params = {
        "user_id": alice,
        "order_id": order_id,
        "hold_id": hold,
        "endpoint_id": 1,
        "monitor_id": 1,
        "voucher_id": voucher,
        "packet_id": packet,
        "transfer_id": transfer,
        "account": alice,
        "queue": "rules-q",
        "element": "e1",
        "biz": "password-recovery",
    }
    bodies = {
        ("POST", "/accounts"): {"user_name": "rules-new"},
        ("PATCH", "/accounts/<user_id>"): {"threshold": "0.00"},
        ("POST", "/accounts/<user_id>/recharge"): {"amount": "1.00"},
        ("POST", "/accounts/<user_id>/deduct"): {"amount": "1.00"},
        ("POST", "/accounts/<user_id>/holds"): {"amount": "1.00"},
        ("POST", "/accounts/<user_id>/monitors"): {"below": "1.00"},
        ("POST", "/webhook-endpoints"): {"url": "http://10.1.1.1/", "event_types": ["charge.persisted"]},
        ("PATCH", "/webhook-endpoints/<endpoint_id>"): {"description": "d"},
        ("POST", "/webhook-endpoints/<endpoint_id>/rotate-secret"): {},
        ("POST", "/webhook-endpoints/<endpoint_id>/replay"): {},
        ("POST", "/accounts/<user_id>/holds/<hold_id>/capture"): {"amount": "0.01"},
        ("POST", "/accounts/<user_id>/orders/<order_id>/refunds"): {"amount": "0.01"},
        ("POST", "/accounts/<user_id>/holds/<hold_id>/refunds"): {"amount": "0.01"},
        ("POST", "/vouchers"): {"title": "t2", "stock": 1, "begin_at": 0, "end_at": 4102444800000},
        ("POST", "/vouchers/<voucher_id>/orders"): {"user_id": alice},
        ("POST", "/redpackets"): {"sender_id": alice, "total": "1.00", "count": 1},
        ("POST", "/redpackets/<packet_id>/grab"): {"user_id": alice},
        ("POST", "/orders"): {"user_id": alice, "amount": "1.00", "close_in_s": 3600},
        ("POST", "/transfers"): {"from": alice, "to": bob, "amount": "0.01"},
        ("POST", "/delay-queues/<queue>/items"): {"element": "e1", "delay_s": 0},
        ("POST", "/delay-queues/<queue>/take"): {"limit": 1},
        ("POST", "/delay-queues/<queue>/ack"): {"receipts": ["1:e1"]},
        ("POST", "/delay-queues/<queue>/extend"): {"receipts": ["1:e1"], "visibility_ms": 1000},
        ("POST", "/delay-queues/<queue>/dead-letters/replay"): {"elements": ["e1"]},
        ("POST", "/inbox/<account>/messages"): {"biz_type": "b", "outer_biz_id": "o1", "title": "t", "content": "c"},
        ("POST", "/ops/dead-letters/replay"): {"source": "stream", "ids": ["0:1-1"]},
    }
    return {
        "alice": alice,
        "bob": bob,
        "params": params,
        "bodies": bodies,
        "voucher_order": voucher_order,
        "payment_order": payment_order,
    }


def _state(sql, redis_client, world) -> tuple:
    """What any accepted request would change: row counts and balances of every table a route writes, and the Redis
    keys and values of the world's entities (not the whole keyspace: other tests' keys expire meanwhile)."""
    tables = (
        "t_account",
        "t_order",
        "t_pay",
        "t_seckill_voucher",
        "t_voucher_order",
        "t_red_packet",
        "t_red_packet_item",
        "t_payment_order",
        "t_idempotency",
        "t_route_key",
        "t_rolled_back",
        "t_hold",
        "t_hold_change",
        "t_entry",
        "t_refund",
        "t_webhook_endpoint",
        "t_webhook_delivery",
        "t_balance_monitor",
        "t_transfer",
    )
    counts = tuple(sql(f"SELECT COUNT(*) FROM {t}")[0][0] for t in tables)
    params = world["params"]
    entities = (
        str(world["alice"]),
        str(world["bob"]),
        f"v{params['voucher_id']}",
        f"rp{params['packet_id']}",
        params["queue"],
        f"account:{world['alice']}",
        f"account:{world['bob']}",
    )
    found = sorted({k for entity in entities for k in redis_client.scan_iter(match=f"*{entity}*", count=1000)})
    lasting = [k for k in found if redis_client.ttl(k) in (-1,) or redis_client.ttl(k) > 60]  # not about to expire
    return (
        counts,
        sql("SELECT SUM(balance), SUM(version) FROM t_account"),
        lasting,
        [redis_client.dump(k) for k in lasting],
    )


S, OP, U, X = "service", "operator", "owner", "another user"
ANYONE = {S, OP, U, X}
# who may call what (docs/api.md, "Who may call what"), written out independently of authorization.rules(): a rule that
# drifts from it fails here
MAY_CALL = {
    ("POST", "/accounts"): {OP},
    ("GET", "/accounts/<user_id>"): {S, OP, U},
    ("PATCH", "/accounts/<user_id>"): {OP},
    ("POST", "/accounts/<user_id>/recharge"): {S},
    ("POST", "/accounts/<user_id>/deduct"): {S},
    ("GET", "/accounts/<user_id>/orders/<order_id>"): {S, OP, U},
    ("GET", "/accounts/<user_id>/entries"): {S, OP, U},
    ("GET", "/accounts/<user_id>/balance"): {S, OP, U},
    ("GET", "/accounts/<user_id>/statement"): {S, OP, U},
    ("POST", "/accounts/<user_id>/holds"): {S},
    ("POST", "/accounts/<user_id>/holds/<hold_id>/capture"): {S},
    ("POST", "/accounts/<user_id>/holds/<hold_id>/void"): {S},
    ("GET", "/accounts/<user_id>/holds/<hold_id>"): {S, OP, U},
    ("GET", "/accounts/<user_id>/holds"): {S, OP, U},
    ("POST", "/webhook-endpoints"): {S, OP},
    ("GET", "/webhook-endpoints"): {S, OP},
    ("GET", "/webhook-endpoints/<endpoint_id>"): {S, OP},
    ("PATCH", "/webhook-endpoints/<endpoint_id>"): {S, OP},
    ("POST", "/webhook-endpoints/<endpoint_id>/rotate-secret"): {S, OP},
    ("DELETE", "/webhook-endpoints/<endpoint_id>"): {S, OP},
    ("GET", "/webhook-endpoints/<endpoint_id>/deliveries"): {S, OP},
    ("POST", "/webhook-endpoints/<endpoint_id>/replay"): {S, OP},
    ("POST", "/accounts/<user_id>/monitors"): {S, OP, U},
    ("GET", "/accounts/<user_id>/monitors"): {S, OP, U},
    ("DELETE", "/accounts/<user_id>/monitors/<monitor_id>"): {S, OP, U},
    ("POST", "/accounts/<user_id>/orders/<order_id>/refunds"): {S},
    ("POST", "/accounts/<user_id>/holds/<hold_id>/refunds"): {S},
    ("POST", "/vouchers"): {OP},
    ("GET", "/vouchers/<voucher_id>"): ANYONE,
    ("POST", "/vouchers/<voucher_id>/orders"): {S, U},
    ("GET", "/vouchers/<voucher_id>/orders/<order_id>"): {S, OP, U},
    ("POST", "/redpackets"): {S},
    ("POST", "/redpackets/<packet_id>/grab"): {S, U},
    ("GET", "/redpackets/<packet_id>"): ANYONE,
    ("POST", "/transfers"): {S, U},
    ("GET", "/transfers/<transfer_id>"): {S, OP, U},
    ("POST", "/orders"): {S},
    ("GET", "/orders/<order_id>"): {S, OP, U},
    ("POST", "/orders/<order_id>/pay"): {S, U},
    ("POST", "/orders/<order_id>/close"): {S},
    ("POST", "/delay-queues/<queue>/items"): {S},
    ("DELETE", "/delay-queues/<queue>/items/<element>"): {S},
    ("GET", "/delay-queues/<queue>"): {S, OP},
    ("POST", "/delay-queues/<queue>/take"): {S},
    ("POST", "/delay-queues/<queue>/ack"): {S},
    ("POST", "/delay-queues/<queue>/extend"): {S},
    ("GET", "/delay-queues/<queue>/dead-letters"): {OP},
    ("POST", "/delay-queues/<queue>/dead-letters/replay"): {OP},
    ("DELETE", "/delay-queues/<queue>/dead-letters/<element>"): {OP},
    ("POST", "/inbox/<account>/messages"): {S},
    ("GET", "/inbox/<account>/messages"): {S, U},
    ("POST", "/journeys/<biz>/<account>/start"): {S},
    ("POST", "/journeys/<biz>/<account>/finish"): {S},
    ("GET", "/ops/dead-letters"): {OP},
    ("POST", "/ops/dead-letters/replay"): {OP},
    ("GET", "/ops/accounts/<user_id>"): {OP},
    ("POST", "/ops/accounts/<user_id>/adjustments"): {OP},
    ("GET", "/ops/reconciler"): {OP},
    ("GET", "/ops/log"): {OP},
    ("POST", "/ops/webhook-secrets/seal"): {OP},
}
PUBLIC = {("GET", "/openapi.json"), ("GET", "/swagger")}
QUERIES = {"/accounts/<user_id>/balance": "?at=0", "/accounts/<user_id>/statement": "?since=0&until=1"}


def test_every_route_rule_with_every_kind_of_caller(api, sql, redis_client):
    """Each route of authorization.rules() tried as the owner, another user, a service, an operator and no one: a
    caller the rule admits is never answered 401/403; anyone else is (another user's entity named by id answers as
    a missing one, 404), and nothing changes."""
    import re

    from api import authorization

    world = _world(api)
    alice, bob = world["alice"], world["bob"]
    callers = {
        "no one": Api(anonymous=True),
        "owner": Api(user_id=alice, scopes=()),
        "another user": Api(user_id=bob, scopes=()),
        "service": Api(scopes=("service",)),
        "operator": Api(scopes=("admin",)),
    }
    entity_id = {"/vouchers/<voucher_id>/orders/<order_id>": world["voucher_order"]}
    tried = 0
    for (method, rule_path), _rule in authorization.rules().items():
        params = {**world["params"], "order_id": entity_id.get(rule_path, world["params"]["order_id"])}
        if rule_path.startswith("/orders/<order_id>"):
            params["order_id"] = world["payment_order"]
        path = re.sub(r"<(\w+)>", lambda m, params=params: str(params[m.group(1)]), rule_path) + QUERIES.get(
            rule_path, ""
        )
        body = world["bodies"].get((method, rule_path))
        assert (method, rule_path) in PUBLIC | set(MAY_CALL), (method, rule_path)  # a new route needs its line
        for who, as_caller in callers.items():
            admitted = (method, rule_path) in PUBLIC or who in MAY_CALL.get((method, rule_path), set())
            before = None if admitted else _state(sql, redis_client, world)
            status, answer = as_caller(method, path, body)
            code = answer["error"]["code"] if isinstance(answer, dict) and "error" in answer else None
            if admitted:
                assert status not in (401, 403) or code not in ("UNAUTHENTICATED", "FORBIDDEN"), (
                    who,
                    method,
                    path,
                    answer,
                )
            else:
                hidden = who == "another user" and rule_path in (
                    "/orders/<order_id>",
                    "/orders/<order_id>/pay",
                    "/vouchers/<voucher_id>/orders/<order_id>",
                    "/transfers/<transfer_id>",
                )
                expected = (404,) if hidden else (401,) if who == "no one" else (403,)
                assert status in expected, (who, method, path, answer)
                assert _state(sql, redis_client, world) == before, (who, method, path)
            tried += 1
    assert tried == 5 * len(authorization.rules())
