"""Issue 21: webhooks through real faults. Charges keep coming while the receiver is down (connections refused),
answers 500s, hangs, then answers slowly, the sending process (the local runtime's scheduled WebhookSenderFunction) is
SIGKILLed and started again, the broker is killed and Redis paused. Beside it (issue 32): an endpoint whose server
answers garbage (not HTTP), a blackholed one (it never answers: each attempt runs to its deadline), and one disabled
while charges are booked and enabled again. Afterwards every booked change of a subscribed type has reached the
receiver and the disabled-then-enabled one, signed (checked with the `standardwebhooks` package), at least once;
de-duplicated by event_id, each account's events arrived in seq order with no gap, each naming the previous one as its
prev_seq; the garbage and blackholed endpoints' deliveries are recorded failed attempts, still PENDING.

And (issue 32) through the same child processes: a host name whose local resolver answers a public then a private
address in turn (DNS rebinding, TTL 0) is never reached at the private address, its attempts recorded failures; and
after two rotations of an endpoint's secret, the second inside the first one's overlap, every delivery carries exactly
the signatures docs/api.md promises: the newest secret's, the one before's and the first one's (each still within its
own overlap)."""

from __future__ import annotations

import contextlib
import json
import threading
import time

from standardwebhooks import Webhook

from faults.test_faults import _account, stack  # noqa: F401 (fixture)
from helpers import LocalService, RawReceiver, Receiver
from helpers.resolver import RebindingResolver, resolver_env

TYPES = ("charge.persisted", "recharge.persisted")


def _charges(api: LocalService, accounts: list[int], stop: threading.Event) -> None:
    """Deducts and recharges, one after another, until stopped; what a fault refuses is simply not booked."""
    n = 0
    while not stop.is_set():
        user_id = accounts[n % len(accounts)]
        kind = "deduct" if n % 3 else "recharge"
        with contextlib.suppress(OSError):  # the API's answer lost in a fault: the DB says what was booked
            api.request("POST", f"/accounts/{user_id}/{kind}", {"amount": "0.10"}, timeout=20)
        n += 1
        time.sleep(0.05)


def _arrived(receiver: Receiver, secret: str) -> dict[int, list[dict]]:
    """Per account, the verified events in the order they first arrived (a repeat of an event_id dropped)."""
    seen, per_account = set(), {}
    for headers, body in list(receiver.got):
        event = Webhook(secret).verify(body, headers)
        if event["data"]["event_id"] not in seen:
            seen.add(event["data"]["event_id"])
            per_account.setdefault(event["data"]["user_id"], []).append(event["data"])
    return per_account


def _booked(servers, accounts: list[int]) -> dict[int, list[int]]:
    rows = servers.sql(
        f"SELECT user_id, seq FROM t_entry WHERE user_id IN ({','.join(['%s'] * len(accounts))})"
        " AND type IN ('deduct', 'recharge') ORDER BY user_id, seq",
        accounts,
    )
    booked: dict[int, list[int]] = {}
    for user_id, seq in rows:
        booked.setdefault(user_id, []).append(seq)
    return booked


def test_every_event_arrives_in_order_once_deduplicated_through_kills_and_a_failing_receiver(stack):  # noqa: F811
    api = stack.service("hooks-api", "--no-schedules").start()  # the API and the writer
    sender = stack.service("hooks-sender-1", "--no-api", "--no-msk").start(wait_http=False)  # the scheduled functions
    receiver, paused = Receiver(500), Receiver()
    garbage, blackhole = RawReceiver(b"HELLO\r\n"), RawReceiver(None)
    hang = threading.Event()
    try:
        status, endpoint = api.request("POST", "/webhook-endpoints", {"url": receiver.url, "event_types": list(TYPES)})
        assert status == 201, endpoint
        bad = []
        for server in (garbage, blackhole):
            status, body = api.request("POST", "/webhook-endpoints", {"url": server.url, "event_types": list(TYPES)})
            assert status == 201, body
            bad.append(body["endpoint_id"])
        status, disabled = api.request("POST", "/webhook-endpoints", {"url": paused.url, "event_types": list(TYPES)})
        assert status == 201, disabled
        path = f"/webhook-endpoints/{disabled['endpoint_id']}"
        assert api.request("PATCH", path, {"enabled": False})[0] == 200
        accounts = [_account(api, "100.00") for _ in range(3)]
        stop = threading.Event()
        clients = threading.Thread(target=_charges, args=(api, accounts, stop))
        clients.start()
        try:
            receiver.down()  # nothing listens: connections refused
            time.sleep(3)
            receiver.up()  # answering 500s: retried with backoff
            time.sleep(3)
            assert api.request("PATCH", path, {"enabled": True})[0] == 200  # what it missed goes out now
            receiver.hold = hang  # now it hangs: each attempt times out
            time.sleep(3)
            sender.kill()  # the sender dies mid-send
            sender = stack.service("hooks-sender-2", "--no-api", "--no-msk").start(wait_http=False)
            receiver.status, receiver.hold, receiver.delay_s = 204, None, 1.0  # slow: a 204 a second later
            hang.set()
            time.sleep(3)
            receiver.delay_s = 0.0
            stack.kill_broker()  # events stop being booked until the writer is back
            time.sleep(2)
            stack.pause_redis(3)
            time.sleep(2)
        finally:
            stop.set()
            clients.join()

        def all_booked_changes_arrived() -> bool:
            pending = [api.request("GET", f"/accounts/{u}")[1].get("pending_orders") for u in accounts]
            if any(pending):
                return False  # still on their way to the DB
            booked = _booked(stack, accounts)
            return all(
                [e["seq"] for e in _arrived(r, secret).get(u, [])] == booked.get(u, [])
                for r, secret in ((receiver, endpoint["secret"]), (paused, disabled["secret"]))
                for u in accounts
            )

        LocalService.wait_until(all_booked_changes_arrived, 180, "every booked change delivered", 1.0)
        booked = _booked(stack, accounts)
        for r, secret in ((receiver, endpoint["secret"]), (paused, disabled["secret"])):
            arrived = _arrived(r, secret)
            for user_id in accounts:
                events = arrived[user_id]
                assert [e["seq"] for e in events] == booked[user_id]  # in order, no gap, once after de-duplication
                assert [e["prev_seq"] for e in events] == [None, *booked[user_id][:-1]]
        arrived = _arrived(receiver, endpoint["secret"])

        def tried(endpoint_id: str) -> list[tuple]:  # (newest first, the API's page would show the untried ones)
            return stack.sql(
                "SELECT state, last_error FROM t_webhook_delivery WHERE endpoint_id = %s AND attempts > 0",
                (int(endpoint_id),),
            )

        for endpoint_id in bad:  # each attempt a recorded failure (a blackholed one at its 15 s deadline)
            LocalService.wait_until(lambda e=endpoint_id: tried(e), 60, f"an attempt of endpoint {endpoint_id}", 1.0)
            assert all(state == "PENDING" and error for state, error in tried(endpoint_id)), tried(endpoint_id)
        repeats = len(receiver.got) - sum(len(e) for e in arrived.values())
        print(f"deliveries: {len(receiver.got)}, events: {len(receiver.got) - repeats}, repeats: {repeats}")
        assert json.loads(receiver.got[0][1])["type"] in TYPES
    finally:
        hang.set()
        receiver.close()
        paused.close()
        garbage.close()
        blackhole.close()
        sender.kill()
        api.stop()


# a public address no test may reach (no route to it here: the attempt fails at once; elsewhere within its deadline)
PUBLIC = "2606:4700:4700::1111"


def test_a_rebinding_name_never_reaches_its_private_address_and_overlapping_rotations_sign_as_documented(
    stack,  # noqa: F811
):
    resolver = RebindingResolver("rebind.hotledger.test", (PUBLIC, "127.0.0.1"))
    api = stack.service("hooks-api-rebind", "--no-schedules", **resolver_env(resolver)).start()
    sender = stack.service("hooks-sender-rebind", "--no-api", "--no-msk", **resolver_env(resolver))
    inside = RawReceiver(b"HTTP/1.1 204 No Content\r\n\r\n")  # a private service the name rebinds to
    receiver = Receiver()
    try:
        url = f"https://rebind.hotledger.test:{inside.port}/hooks"
        status, rebinding = api.request("POST", "/webhook-endpoints", {"url": url, "event_types": list(TYPES)})
        assert status == 201 and resolver.asked == [PUBLIC], (rebinding, resolver.asked)  # public when registered
        status, first = api.request("POST", "/webhook-endpoints", {"url": receiver.url, "event_types": list(TYPES)})
        assert status == 201, first
        secrets, rotate = [first["secret"]], f"/webhook-endpoints/{first['endpoint_id']}/rotate-secret"
        for overlap_s in (3600, 7200):  # the second inside the first one's hour
            status, rotated = api.request("POST", rotate, {"overlap_s": overlap_s})
            assert status == 200, rotated
            secrets.append(rotated["secret"])
        user_id = _account(api, "10.00")
        for _ in range(3):
            assert api.request("POST", f"/accounts/{user_id}/deduct", {"amount": "0.10"})[0] == 200
        sender.start(wait_http=False)

        def attempts() -> list[tuple]:
            return stack.sql(
                "SELECT state, attempts, last_error FROM t_webhook_delivery WHERE endpoint_id = %s",
                (int(rebinding["endpoint_id"]),),
            )

        # the sender's first look got the private answer (refused), its retry the public one: connected there only
        LocalService.wait_until(
            lambda: len(resolver.asked) >= 3 and any(a >= 2 for _, a, _ in attempts()), 90, "a retried attempt", 1.0
        )
        assert inside.accepted == 0, (resolver.asked, attempts())  # never reached
        # each attempt a recorded failure; what is behind it in its account's order waits, untried
        assert all(state == "PENDING" and bool(error) == (tried > 0) for state, tried, error in attempts()), attempts()
        LocalService.wait_until(lambda: len(_arrived(receiver, secrets[-1]).get(user_id, [])) == 4, 60, "4 events")
        for headers, body in receiver.got:  # recharge and 3 charges, each signed by C, B and A, none else
            assert len(headers["webhook-signature"].split(" ")) == 3, headers
            for secret in secrets:
                assert Webhook(secret).verify(body, headers)["data"]["user_id"] == user_id
    finally:
        sender.kill()
        api.stop()
        inside.close()
        receiver.close()
        resolver.close()
