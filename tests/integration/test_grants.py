"""Issue 34, credit grants: a recharge may carry a grant (expires_at, category); deducts spend grants first-to-expire,
then the plain balance; an expired grant counts for nothing at once and its expiry entry (kind G) takes what was left
of it off the balance, booked once. Driven through the API handler, the writer and the delay drainer on the real
Redis, DB and broker, for an ASYNC and a SYNC account alike."""

import time

import pytest

from helpers import invoke_writer, ledger_records, rebuilt_after_the_writer_caught_up
from hotledger import keys
from infra.localrt import events


def _persist(redis_client, *user_ids):
    assert invoke_writer(ledger_records(redis_client, list(user_ids))) == {"batchItemFailures": []}


def _drain():
    from delay_drainer.app import handler

    return handler(events.scheduled(), events.LambdaContext("DelayDrainerFunction", timeout_s=4))


def _grant(api, user_id, amount, expires_in_ms, category="promo"):
    expires_at = int(time.time() * 1000) + expires_in_ms
    status, body = api(
        "POST",
        f"/accounts/{user_id}/recharge",
        {"amount": amount, "grant": {"expires_at": expires_at, "category": category}},
    )
    assert status == 200, body
    return body["pay_id"], expires_at


def _account(api, user_id):
    status, body = api("GET", f"/accounts/{user_id}")
    assert status == 200, body
    return body


def _remaining(api, user_id):
    return {g["grant_id"]: g["remaining"] for g in _account(api, user_id)["grants"]}


def _assert_db_agrees(sql, user_id, balance_minor):
    rows = sql("SELECT seq, delta, balance_after FROM t_entry WHERE user_id = %s ORDER BY seq", (user_id,))
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    running = 0
    for _, delta, balance_after in rows:
        running += delta
        assert balance_after == running
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((running,),)
    assert running == balance_minor


def _booked_with(redis_client, sql, user_id, grant_id, remaining, balance_minor):
    """Once the writer caught up: the grant has `remaining` left in the DB and the ledger adds up to the balance."""
    _persist(redis_client, user_id)
    assert sql("SELECT remaining FROM t_grant WHERE id = %s", (int(grant_id),)) == ((remaining,),)
    _assert_db_agrees(sql, user_id, balance_minor)


@pytest.fixture(params=["ASYNC", "SYNC"])
def deduct_type(request):
    return request.param


def test_a_deduct_spends_the_sooner_expiring_grant_first_then_the_plain_balance(api, redis_client, sql, deduct_type):
    user_id = api.account(balance="10.00", deduct_type=deduct_type, threshold="0.00")
    later, _ = _grant(api, user_id, "5.00", 3_600_000)
    sooner, sooner_at = _grant(api, user_id, "3.00", 600_000, category="loyalty")
    account = _account(api, user_id)
    assert (account["balance"], account["available"]) == ("18.00", "18.00")
    assert sorted(account["grants"], key=lambda g: g["expires_at"])[0] == {
        "grant_id": sooner,
        "remaining": "3.00",
        "expires_at": sooner_at,
        "category": "loyalty",
    }
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    assert (status, body["balance"]) == (200, "14.00"), body
    assert _remaining(api, user_id) == {later: "4.00"}  # the sooner one spent whole, the later one 1.00
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "6.00"})
    assert (status, body["balance"]) == (200, "8.00"), body
    assert _remaining(api, user_id) == {}  # the later one spent, 2.00 of the plain balance
    _persist(redis_client, user_id)
    assert sql("SELECT id, remaining FROM t_grant WHERE user_id = %s ORDER BY id", (user_id,)) == tuple(
        sorted(((int(later), 0), (int(sooner), 0)))
    )
    spent = sql("SELECT grant_id, amount FROM t_grant_spend WHERE user_id = %s ORDER BY entry_id, grant_id", (user_id,))
    assert sorted(spent) == sorted(((int(sooner), 300), (int(later), 100), (int(later), 400)))
    _assert_db_agrees(sql, user_id, 800)


def test_grants_made_while_sync_are_spent_first_once_the_account_is_async_again(api, redis_client, sql):
    """The account was cached without grants; made SYNC, it got one in the DB; the switch back to ASYNC loads it from
    the DB, grant and all, and its hash says it has grants now: a deduct in Redis spends the grant first (issue 33
    goal 2: a deduct reads from the account's hash whether to look for grants)."""
    user_id = api.account(balance="10.00")
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert (status, body["mode"]) == (200, "ASYNC"), body
    assert redis_client.hget(keys.balance(user_id), "grants") == b"0"
    _persist(redis_client, user_id)
    assert api("PATCH", f"/accounts/{user_id}", {"deduct_type": "SYNC"})[0] == 200
    grant_id, _ = _grant(api, user_id, "3.00", 600_000)
    assert api("PATCH", f"/accounts/{user_id}", {"deduct_type": "ASYNC"})[0] == 200
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})
    assert (status, body["mode"], body["balance"]) == (200, "ASYNC", "10.00"), body
    assert _remaining(api, user_id) == {grant_id: "1.00"}
    _persist(redis_client, user_id)
    _assert_db_agrees(sql, user_id, 1000)


def test_an_expired_grant_never_counts_and_its_expiry_entry_is_booked_once(api, redis_client, sql, deduct_type):
    user_id = api.account(balance="10.00", deduct_type=deduct_type, threshold="0.00")
    grant_id, _ = _grant(api, user_id, "5.00", 1_000)
    assert _account(api, user_id)["available"] == "15.00"
    time.sleep(1.05)
    account = _account(api, user_id)  # nothing booked yet: the grant counts for nothing all the same
    assert (account["balance"], account["available"], account["grants"]) == ("15.00", "10.00", [])
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "11.00"})
    assert (status, body["error"]["code"]) == (402, "INSUFFICIENT_BALANCE")
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert status == 200, body  # from the plain balance: the expired grant is not spent
    _persist(redis_client, user_id)  # what was charged before expires_at is booked first (the expiry waits for it)
    _drain()
    _drain()  # a second drain finds nothing to do
    _persist(redis_client, user_id)
    account = _account(api, user_id)
    assert (account["balance"], account["available"]) == ("9.00", "9.00")
    assert sql("SELECT state, remaining FROM t_grant WHERE id = %s", (int(grant_id),)) == (("EXPIRED", 0),)
    types = [r[0] for r in sql("SELECT type FROM t_entry WHERE user_id = %s ORDER BY seq", (user_id,))]
    assert types.count("grant_expiry") == 1
    _assert_db_agrees(sql, user_id, 900)


@pytest.mark.parametrize(
    "path, body",
    [
        ("recharge", {"amount": "5.00", "grant": {"expires_at": 1_000, "category": "promo"}}),
        ("recharge", {"amount": "5.00", "grant": {"expires_at": 4_102_444_800_000, "category": "Promo Code!"}}),
        ("deduct", {"amount": "1.00", "grant": {"expires_at": 4_102_444_800_000, "category": "promo"}}),
    ],
    ids=["expires-in-the-past", "bad-category", "grant-on-a-deduct"],
)
def test_a_bad_grant_is_a_422_that_changes_nothing(api, path, body):
    user_id = api.account(balance="10.00")
    before = _account(api, user_id)
    status, answer = api("POST", f"/accounts/{user_id}/{path}", body)
    assert status == 422 and answer["error"]["code"] in ("INVALID_GRANT", "VALIDATION_ERROR"), answer
    assert _account(api, user_id) == before


def test_the_grants_are_rebuilt_from_the_db_after_a_redis_loss(api, redis_client, sql):
    user_id = api.account(balance="10.00")
    later, _ = _grant(api, user_id, "5.00", 3_600_000)
    sooner, _ = _grant(api, user_id, "3.00", 600_000)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert status == 200, body
    _persist(redis_client, user_id)
    for key in redis_client.scan_iter(match=f"*{{{user_id}}}*"):  # the account's slot, lost whole
        redis_client.delete(key)
    rebuilt_after_the_writer_caught_up(redis_client, user_id)
    assert redis_client.exists(keys.balance(user_id))
    assert _remaining(api, user_id) == {later: "5.00", sooner: "2.00"}
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"})
    assert (status, body["balance"]) == (200, "14.00"), body
    assert _remaining(api, user_id) == {later: "4.00"}
    _persist(redis_client, user_id)
    _assert_db_agrees(sql, user_id, 1400)


def test_the_reconciler_ends_an_expired_grant_whose_delay_element_was_lost(api, redis_client, sql, monkeypatch):
    from helpers import reconcile_totals
    from hotledger.grants import feature

    user_id = api.account(balance="10.00")
    grant_id, _ = _grant(api, user_id, "3.00", 1_000)
    _persist(redis_client, user_id)
    for key in redis_client.scan_iter(match="*grant-expiry*"):  # lost, whatever the queue's key layout
        if redis_client.type(key) in (b"zset", "zset"):
            redis_client.zrem(key, f"{user_id}:{grant_id}")
    monkeypatch.setattr(feature, "EXPIRY_GRACE_MS", 0)
    time.sleep(1.05)
    assert reconcile_totals()["grants_expired"] >= 1
    _persist(redis_client, user_id)
    assert sql("SELECT state FROM t_grant WHERE id = %s", (int(grant_id),)) == (("EXPIRED",),)
    _assert_db_agrees(sql, user_id, 1000)


def test_a_grant_spent_whole_ends_without_an_entry_and_one_not_due_waits(api, redis_client, sql):
    user_id = api.account(balance="10.00")
    spent, _ = _grant(api, user_id, "2.00", 1_000)
    later, _ = _grant(api, user_id, "2.00", 3_600_000)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})
    assert status == 200, body
    assert runtime_grants().expire(user_id, int(later)) is False  # not due: the drainer offers it again later
    time.sleep(1.05)
    _drain()
    _persist(redis_client, user_id)
    assert _account(api, user_id)["balance"] == "12.00"
    types = [r[0] for r in sql("SELECT type FROM t_entry WHERE user_id = %s ORDER BY seq", (user_id,))]
    assert "grant_expiry" not in types
    assert _remaining(api, user_id) == {later: "2.00"}
    _assert_db_agrees(sql, user_id, 1200)


def test_an_expiry_finding_the_account_gone_from_redis_loads_it_and_ends_the_grant(api, redis_client, sql):
    user_id = api.account(balance="10.00")
    grant_id, _ = _grant(api, user_id, "4.00", 1_000)
    _persist(redis_client, user_id)
    redis_client.delete(keys.balance(user_id))  # the cached account lost (its grants come back from the DB)
    time.sleep(1.05)
    _drain()  # loads the account: rebuilt after a loss, it ends the grant once the log before the loss is applied
    rebuilt_after_the_writer_caught_up(redis_client, user_id)
    assert runtime_grants().expire(user_id, int(grant_id)) is True
    _persist(redis_client, user_id)
    assert sql("SELECT state FROM t_grant WHERE id = %s", (int(grant_id),)) == (("EXPIRED",),)
    assert _account(api, user_id)["balance"] == "10.00"
    _assert_db_agrees(sql, user_id, 1000)


def _broker_down(monkeypatch, *services):
    """Every publish of these services fails (PUBLISH_FAILED: their changes are taken back)."""
    from hotledger.dal.publisher import NotAcknowledged

    def broker_down(key_, event):
        raise NotAcknowledged("no acknowledgement in time")

    for service in services:
        monkeypatch.setattr(service.durability, "publish", broker_down)


def test_a_failed_publish_takes_back_a_grant_its_spends_and_its_expiry(api, redis_client, sql, monkeypatch):
    from hotledger.ledger.feature import ledger

    user_id = api.account(balance="10.00")
    kept, _ = _grant(api, user_id, "3.00", 3_600_000)
    short, _ = _grant(api, user_id, "2.00", 1_000)
    _persist(redis_client, user_id)  # booked, so the expiry below does not wait for them
    _broker_down(monkeypatch, ledger(), runtime_grants())
    expires_at = int(time.time() * 1000) + 600_000
    status, body = api(
        "POST",
        f"/accounts/{user_id}/recharge",
        {"amount": "5.00", "grant": {"expires_at": expires_at, "category": "x"}},
    )
    assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED")
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED")
    assert _remaining(api, user_id) == {kept: "3.00", short: "2.00"}  # no grant made, none spent
    time.sleep(1.05)
    _drain()  # the expiry's publish fails: the grant is back, still expired, still counted for nothing
    account = _account(api, user_id)
    assert (account["balance"], account["available"], account["grants"]) == ("15.00", "13.00", account["grants"])
    assert redis_client.hexists(keys.grants(user_id), short)
    monkeypatch.undo()
    assert runtime_grants().expire(user_id, int(short)) is True
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    assert (status, body["balance"]) == (200, "9.00"), body
    _persist(redis_client, user_id)
    assert sql("SELECT id, remaining, state FROM t_grant WHERE user_id = %s ORDER BY id", (user_id,)) == (
        (int(kept), 0, "ACTIVE"),
        (int(short), 0, "EXPIRED"),
    )
    _assert_db_agrees(sql, user_id, 900)


@pytest.mark.parametrize("charge", ["deduct", "refund"])
def test_an_expiry_waits_for_the_entries_made_before_it_that_may_still_be_taken_back(
    api, redis_client, sql, monkeypatch, charge
):
    """Found by the chaos test's grants thread (granted 3.39 = spent 1.12 + expired 1.32 + remaining 0): a deduct spent
    part of a grant, its publish hung past the grant's expires_at, the drainer ended the grant meanwhile (taking only
    what the deduct had left), then the deduct was taken back and its part landed in the plain balance: promo credit
    made permanent. A refund's give-back taken back the same way took plain money. An expiry waits until no entry made
    before its expires_at is still on its way to the DB."""
    from hotledger.dal.publisher import NotAcknowledged
    from hotledger.ledger.feature import ledger
    from hotledger.refunds.feature import refunds

    user_id = api.account(balance="10.00", threshold="0.00")
    grant_id, expires_at = _grant(api, user_id, "3.00", 1_500)
    order_id = None
    if charge == "refund":
        status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})  # the grant's 2.00
        assert status == 200, body
        order_id = body["order_id"]
    _persist(redis_client, user_id)
    ended_meanwhile = []

    def publish_hangs_past_expires_at(key_, event):
        time.sleep(max(expires_at - time.time() * 1000, 0) / 1000 + 0.05)
        ended_meanwhile.append(runtime_grants().expire(user_id, int(grant_id)))
        raise NotAcknowledged("no acknowledgement in time")

    service = ledger() if charge == "deduct" else refunds()
    monkeypatch.setattr(service.durability, "publish", publish_hangs_past_expires_at)
    if charge == "deduct":
        status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})  # 1.00 of the grant
    else:  # 1.00 back to the grant
        status, body = api("POST", f"/accounts/{user_id}/orders/{order_id}/refunds", {"amount": "1.00", "reason": "r"})
    assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED"), body
    assert ended_meanwhile == [False]  # the taken-back entry was still on its way: the expiry waited
    monkeypatch.undo()
    assert runtime_grants().expire(user_id, int(grant_id)) is True
    left = 300 if charge == "deduct" else 100  # all the grant had left without the taken-back entry
    assert _account(api, user_id)["balance"] == "10.00"
    _persist(redis_client, user_id)
    assert sql("SELECT amount FROM t_grant_expiry WHERE grant_id = %s", (int(grant_id),)) == ((left,),)
    _assert_db_agrees(sql, user_id, 1000)


def runtime_grants():
    from hotledger.grants.feature import grants

    return grants()


def test_the_history_shows_which_grants_each_entry_spent_pending_and_booked(api, redis_client):
    user_id = api.account(balance="1.00")
    later, _ = _grant(api, user_id, "5.00", 3_600_000)
    sooner, _ = _grant(api, user_id, "3.00", 600_000)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    assert status == 200, body
    spent = [{"grant_id": sooner, "amount": "3.00"}, {"grant_id": later, "amount": "1.00"}]

    def deduct_entry():
        status, page = api("GET", f"/accounts/{user_id}/entries?types=deduct")
        assert status == 200, page
        (entry,) = page["entries"]
        return entry

    assert (deduct_entry()["state"], deduct_entry()["grants_spent"]) == ("pending", spent)
    _persist(redis_client, user_id)
    assert (deduct_entry()["state"], deduct_entry()["grants_spent"]) == ("booked", spent)
    status, page = api("GET", f"/accounts/{user_id}/entries?types=recharge")
    assert status == 200 and all(e["grants_spent"] == [] for e in page["entries"]), page


def test_an_expired_grant_is_not_held_either(api, deduct_type):
    user_id = api.account(balance="10.00", deduct_type=deduct_type, threshold="0.00")
    _grant(api, user_id, "5.00", 1_000)
    time.sleep(1.05)
    status, body = api("POST", f"/accounts/{user_id}/holds", {"amount": "12.00"})
    assert (status, body["error"]["code"]) == (402, "INSUFFICIENT_BALANCE"), body
    status, body = api("POST", f"/accounts/{user_id}/holds", {"amount": "10.00"})
    assert status == 201, body
    assert _account(api, user_id)["available"] == "0.00"


def test_a_grants_expiry_is_a_grant_expired_webhook_event(api, redis_client, local_hooks):
    from hotledger.webhooks.feature import webhooks

    receiver = local_hooks()
    status, endpoint = api(
        "POST", "/webhook-endpoints", {"url": receiver.url, "event_types": ["grant.expired"], "description": "t"}
    )
    assert status == 201, endpoint
    user_id = api.account(balance="10.00")
    grant_id, _ = _grant(api, user_id, "4.00", 1_000)
    _persist(redis_client, user_id)
    time.sleep(1.05)
    _drain()
    _persist(redis_client, user_id)
    webhooks().send_due()
    events = [e for e in receiver.events(endpoint["secret"]) if e["data"]["user_id"] == user_id]
    assert [(e["type"], e["data"]["amount"]) for e in events] == [("grant.expired", "4.00")]


def _hold(api, user_id, amount, expires_in_s=900):
    status, body = api("POST", f"/accounts/{user_id}/holds", {"amount": amount, "expires_in_s": expires_in_s})
    assert status == 201, body
    return body["hold_id"]


def _capture(api, user_id, hold_id, amount, **fields):
    return api("POST", f"/accounts/{user_id}/holds/{hold_id}/capture", {"amount": amount, **fields})


def test_a_capture_spends_the_live_grants_first_to_expire_then_the_plain_balance(api, redis_client, sql, deduct_type):
    user_id = api.account(balance="10.00", deduct_type=deduct_type, threshold="0.00")
    later, _ = _grant(api, user_id, "5.00", 3_600_000)
    sooner, _ = _grant(api, user_id, "3.00", 600_000)
    hold_id = _hold(api, user_id, "10.00")
    assert _remaining(api, user_id) == {later: "5.00", sooner: "3.00"}  # a hold reserves; it spends no grant
    status, body = _capture(api, user_id, hold_id, "4.00")
    assert (status, body["balance"], body["available"]) == (200, "14.00", "8.00"), body
    assert _remaining(api, user_id) == {later: "4.00"}
    status, body = _capture(api, user_id, hold_id, "6.00", final=True)
    assert (status, body["balance"], body["state"]) == (200, "8.00", "CAPTURED"), body
    assert _remaining(api, user_id) == {}  # the later one's 4.00, then 2.00 of the plain balance
    spent = [
        [{"grant_id": sooner, "amount": "3.00"}, {"grant_id": later, "amount": "1.00"}],
        [{"grant_id": later, "amount": "4.00"}],
    ]

    def captures():
        status, page = api("GET", f"/accounts/{user_id}/entries?types=capture")
        assert status == 200, page
        return sorted((e["amount"], e["grants_spent"]) for e in page["entries"])

    assert captures() == [("4.00", spent[0]), ("6.00", spent[1])]
    _persist(redis_client, user_id)
    assert captures() == [("4.00", spent[0]), ("6.00", spent[1])]
    assert sql("SELECT id, remaining FROM t_grant WHERE user_id = %s ORDER BY id", (user_id,)) == tuple(
        sorted(((int(later), 0), (int(sooner), 0)))
    )
    rows = sql("SELECT grant_id, amount FROM t_grant_spend WHERE user_id = %s", (user_id,))
    assert sorted(rows) == sorted(((int(sooner), 300), (int(later), 100), (int(later), 400)))
    _assert_db_agrees(sql, user_id, 800)


def test_a_capture_never_takes_what_a_grant_that_expired_while_the_hold_was_open_held(
    api, redis_client, sql, deduct_type
):
    user_id = api.account(balance="2.00", deduct_type=deduct_type, threshold="0.00")
    _grant(api, user_id, "5.00", 1_000)
    hold_id = _hold(api, user_id, "6.00")  # placed against the grant while it was live
    time.sleep(1.05)
    status, body = _capture(api, user_id, hold_id, "3.00")
    assert (status, body["error"]["code"]) == (402, "INSUFFICIENT_BALANCE"), body  # only 2.00 is there
    status, body = _capture(api, user_id, hold_id, "2.00")
    assert (status, body["balance"], body["captured"]) == (200, "5.00", "2.00"), body  # from the plain balance
    status, body = api("POST", f"/accounts/{user_id}/holds/{hold_id}/void")
    assert status == 200, body
    _persist(redis_client, user_id)
    _drain()
    _persist(redis_client, user_id)
    assert _account(api, user_id)["balance"] == "0.00"
    assert sql("SELECT COUNT(*) FROM t_grant_spend WHERE user_id = %s", (user_id,)) == ((0,),)
    _assert_db_agrees(sql, user_id, 0)


def test_capture_and_void_entries_leave_expired_grants_out_of_available_after(api, redis_client, sql, deduct_type):
    user_id = api.account(balance="10.00", deduct_type=deduct_type, threshold="0.00")
    _grant(api, user_id, "5.00", 1_000)
    hold_id = _hold(api, user_id, "4.00")
    time.sleep(1.05)
    status, body = _capture(api, user_id, hold_id, "1.00")
    assert (status, body["balance"], body["available"]) == (200, "14.00", "6.00"), body  # 14 - 3 held - 5 expired
    status, body = api("POST", f"/accounts/{user_id}/holds/{hold_id}/void")
    assert (status, body["balance"], body["available"]) == (200, "14.00", "9.00"), body
    # the replies are the entries' available_after (hold_change.lua's, or the SYNC change's event)
    _persist(redis_client, user_id)
    _drain()
    _persist(redis_client, user_id)
    _assert_db_agrees(sql, user_id, 900)


def test_a_capture_whose_publish_failed_gives_its_spends_back(api, redis_client, sql, monkeypatch):
    from hotledger.holds.feature import holds

    user_id = api.account(balance="10.00")
    grant_id, _ = _grant(api, user_id, "3.00", 600_000)
    hold_id = _hold(api, user_id, "5.00")
    _broker_down(monkeypatch, holds())
    status, body = _capture(api, user_id, hold_id, "2.00")
    assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED")
    assert _remaining(api, user_id) == {grant_id: "3.00"}
    monkeypatch.undo()
    status, body = _capture(api, user_id, hold_id, "2.00")
    assert (status, body["balance"]) == (200, "11.00"), body
    assert _remaining(api, user_id) == {grant_id: "1.00"}
    _booked_with(redis_client, sql, user_id, grant_id, 100, 1100)


def test_what_captures_spent_is_rebuilt_from_the_db_after_a_redis_loss(api, redis_client, sql):
    user_id = api.account(balance="10.00")
    grant_id, _ = _grant(api, user_id, "3.00", 600_000)
    hold_id = _hold(api, user_id, "5.00")
    assert _capture(api, user_id, hold_id, "2.00")[0] == 200
    _persist(redis_client, user_id)
    for key in redis_client.scan_iter(match=f"*{{{user_id}}}*"):  # the account's slot, lost whole
        redis_client.delete(key)
    rebuilt_after_the_writer_caught_up(redis_client, user_id)
    assert _remaining(api, user_id) == {grant_id: "1.00"}
    status, body = _capture(api, user_id, hold_id, "2.00")
    assert (status, body["balance"]) == (200, "9.00"), body
    assert _remaining(api, user_id) == {}
    _booked_with(redis_client, sql, user_id, grant_id, 0, 900)


def _refund(api, user_id, order_id, amount):
    status, body = api("POST", f"/accounts/{user_id}/orders/{order_id}/refunds", {"amount": amount, "reason": "r"})
    assert status == 201, body
    return body


def _refunds_given_back(api, user_id):
    status, page = api("GET", f"/accounts/{user_id}/entries?types=refund")
    assert status == 200, page
    return sorted((e["amount"], e["grants_refunded"]) for e in page["entries"])


def test_a_refund_gives_back_the_plain_balance_first_then_the_grants_last_spent_first(
    api, redis_client, sql, deduct_type
):
    user_id = api.account(balance="10.00", deduct_type=deduct_type, threshold="0.00")
    later, _ = _grant(api, user_id, "5.00", 3_600_000)
    sooner, _ = _grant(api, user_id, "3.00", 600_000)
    status, order = api("POST", f"/accounts/{user_id}/deduct", {"amount": "10.00"})  # 3 + 5 of grants, 2 plain
    assert status == 200, order
    _persist(redis_client, user_id)  # a refund names a booked charge
    _refund(api, user_id, order["order_id"], "3.00")  # the plain 2.00, then 1.00 of the last spent (later)
    assert _remaining(api, user_id) == {later: "1.00"}
    _refund(api, user_id, order["order_id"], "6.00")  # the rest of later's 5.00, then 2.00 of sooner's 3.00
    assert _remaining(api, user_id) == {later: "5.00", sooner: "2.00"}
    given_back = [
        ("3.00", [{"grant_id": later, "amount": "1.00"}]),
        ("6.00", [{"grant_id": later, "amount": "4.00"}, {"grant_id": sooner, "amount": "2.00"}]),
    ]
    assert _refunds_given_back(api, user_id) == given_back
    _persist(redis_client, user_id)
    assert _refunds_given_back(api, user_id) == given_back
    assert _account(api, user_id)["balance"] == "17.00"
    assert sql("SELECT id, remaining FROM t_grant WHERE user_id = %s ORDER BY id", (user_id,)) == tuple(
        sorted(((int(later), 500), (int(sooner), 200)))
    )
    net = sql("SELECT grant_id, SUM(amount) FROM t_grant_spend WHERE user_id = %s GROUP BY grant_id", (user_id,))
    assert sorted((g, int(a)) for g, a in net) == sorted(((int(later), 0), (int(sooner), 100)))
    _assert_db_agrees(sql, user_id, 1700)


def test_a_refund_never_revives_an_expired_grant_its_share_is_plain_balance(api, redis_client, sql, deduct_type):
    user_id = api.account(balance="10.00", deduct_type=deduct_type, threshold="0.00")
    grant_id, _ = _grant(api, user_id, "3.00", 1_500)
    status, order = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})  # 3.00 of the grant, 1.00 plain
    assert status == 200, order
    _persist(redis_client, user_id)
    time.sleep(1.55)
    _refund(api, user_id, order["order_id"], "4.00")
    account = _account(api, user_id)
    assert (account["balance"], account["available"], account["grants"]) == ("13.00", "13.00", [])
    assert _refunds_given_back(api, user_id) == [("4.00", [])]
    _drain()
    _persist(redis_client, user_id)
    assert _account(api, user_id)["balance"] == "13.00"
    assert sql("SELECT remaining FROM t_grant WHERE id = %s", (int(grant_id),)) == ((0,),)
    _assert_db_agrees(sql, user_id, 1300)


def test_a_refund_whose_publish_failed_takes_back_what_it_gave_its_grants(api, redis_client, sql, monkeypatch):
    from hotledger.refunds.feature import refunds

    user_id = api.account(balance="10.00")
    grant_id, _ = _grant(api, user_id, "3.00", 600_000)
    status, order = api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"})
    assert status == 200, order
    _persist(redis_client, user_id)
    _broker_down(monkeypatch, refunds())
    status, body = api(
        "POST", f"/accounts/{user_id}/orders/{order['order_id']}/refunds", {"amount": "2.00", "reason": "r"}
    )
    assert (status, body["error"]["code"]) == (503, "PUBLISH_FAILED")
    assert (_account(api, user_id)["balance"], _remaining(api, user_id)) == ("10.00", {})
    monkeypatch.undo()
    _refund(api, user_id, order["order_id"], "2.00")
    assert _remaining(api, user_id) == {grant_id: "2.00"}
    _booked_with(redis_client, sql, user_id, grant_id, 200, 1200)


def test_what_refunds_gave_back_is_rebuilt_after_a_redis_loss(api, redis_client, sql):
    user_id = api.account(balance="10.00")
    grant_id, _ = _grant(api, user_id, "3.00", 600_000)
    status, order = api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"})
    assert status == 200, order
    _persist(redis_client, user_id)
    _refund(api, user_id, order["order_id"], "1.00")
    _persist(redis_client, user_id)
    for key in redis_client.scan_iter(match=f"*{{{user_id}}}*"):  # the account's slot, lost whole
        redis_client.delete(key)
    rebuilt_after_the_writer_caught_up(redis_client, user_id)
    assert _remaining(api, user_id) == {grant_id: "1.00"}
    _refund(api, user_id, order["order_id"], "2.00")
    assert _remaining(api, user_id) == {grant_id: "3.00"}
    _persist(redis_client, user_id)
    _assert_db_agrees(sql, user_id, 1300)


def test_an_expiry_waits_for_the_spends_acknowledged_before_a_redis_loss(api, redis_client, sql, own_topic):
    """Found by the chaos test's grants thread: a grant spent whole, its deduct acknowledged and still in the log when
    Redis lost the account, was rebuilt from the DB whole, and its expiry took its amount off the balance a second
    time (the plain balance paid for it). The expiry waits for the log as a hold's change does (lib/rebuild_hold)."""
    from helpers import broker_records, lift_rebuild_hold
    from hotledger.ledger import feature as ledger_feature

    user_id = api.account(balance="10.00")
    _persist(redis_client, user_id)
    grant_id, _ = _grant(api, user_id, "1.00", 1_000)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})  # the grant, spent whole
    assert status == 200, body
    assert invoke_writer(broker_records()[:-1]) == {"batchItemFailures": []}  # the grant lands; the deduct lags
    for key in redis_client.scan_iter(match=f"*{{{user_id}}}*"):  # the account's slot, lost whole
        redis_client.delete(key)
    ledger_feature.ledger().load_cache(user_id)  # rebuilt from the DB: the grant whole, the log still holding more
    time.sleep(1.05)
    lift_rebuild_hold(redis_client, keys.balance(user_id), log_too=False)  # the time hold over, the log's not
    assert runtime_grants().expire(user_id, int(grant_id)) is False  # the deduct may still spend it: later
    assert invoke_writer(broker_records()) == {"batchItemFailures": []}  # the deduct lands
    lift_rebuild_hold(redis_client, keys.balance(user_id))
    ledger_feature.ledger().lift_rebuild_hold(user_id, 0)
    assert runtime_grants().expire(user_id, int(grant_id)) is True
    _persist(redis_client, user_id)
    assert sql("SELECT COUNT(*) FROM t_grant_expiry WHERE grant_id = %s", (int(grant_id),)) == ((0,),)
    _assert_db_agrees(sql, user_id, 1000)


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_a_granted_recharge_retried_under_its_key_after_its_expires_at_is_answered_as_the_first_time(api, deduct_type):
    """An answer given for an Idempotency-Key is the answer for that key: the "expires_at in the future" check is the
    request's first try's, not a retry's (a client retrying a lost answer after a short grant ended got 422)."""
    user_id = api.account(balance="1.00", deduct_type=deduct_type)
    expires_at = int(time.time() * 1000) + 1_000
    body = {"amount": "2.00", "grant": {"expires_at": expires_at, "category": "promo"}}
    path, key = f"/accounts/{user_id}/recharge", {"Idempotency-Key": "grant-retried-late"}
    first = api("POST", path, body, key)
    assert first[0] == 200, first
    time.sleep(max(0.0, expires_at / 1000 - time.time()) + 0.2)
    assert api("POST", path, body, key) == first
    assert _account(api, user_id)["balance"] == "3.00"  # credited once
    other = {"amount": "2.00", "grant": {"expires_at": expires_at + 1, "category": "promo"}}
    status, conflict = api("POST", path, other, key)
    assert (status, conflict["error"]["code"]) == (409, "IDEMPOTENCY_KEY_REUSED")
    status, late = api("POST", path, body, {"Idempotency-Key": "grant-new-late"})
    assert (status, late["error"]["code"]) == (422, "INVALID_GRANT")  # a new request still may not grant the past


def test_a_deduct_spending_grants_waits_for_the_spends_acknowledged_before_a_redis_loss(
    api, redis_client, sql, own_topic
):
    """A deduct without an Idempotency-Key on an account Redis lost and rebuilt from the DB while a spend of its grant
    was still in the log spent the grant again: the DB took both spends from it (its remaining stopped at 0) while the
    cache kept what the second left, which the grant's expiry then took from the plain balance. A debit that spends
    grants waits for the log on a rebuilt account, as a key Redis does not know does (lib/rebuild_hold)."""
    from helpers import broker_records, lift_rebuild_hold
    from hotledger import runtime

    user_id = api.account(balance="10.00")
    _persist(redis_client, user_id)
    grant_id, _ = _grant(api, user_id, "3.00", 3_600_000)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})  # 2.00 of the grant
    assert status == 200, body
    assert invoke_writer(broker_records()[:-1]) == {"batchItemFailures": []}  # the grant lands; the deduct lags
    for key in redis_client.scan_iter(match=f"*{{{user_id}}}*"):  # the account's slot, lost whole
        redis_client.delete(key)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})
    assert (status, body["error"]["code"]) == (503, "RECOVERING"), body
    lift_rebuild_hold(redis_client, keys.balance(user_id), log_too=False)  # the time hold over, the log's not
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})
    assert (status, body["error"]["code"]) == (503, "RECOVERING"), body
    records = broker_records()
    assert invoke_writer(records) == {"batchItemFailures": []}  # the first deduct lands
    runtime.outbox().record_applied({(own_topic, partition): offset for partition, offset, _, _ in records})
    lift_rebuild_hold(redis_client, keys.balance(user_id), log_too=False)  # the last 'held' moved it on by 1 s
    # held once more, this caller finds the writer's watermark past the log's end: the account is reloaded from the DB
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})  # the grant's last 1.00, then plain
    assert (status, body["balance"]) == (200, "9.00"), body
    assert _remaining(api, user_id) == {}
    _booked_with(redis_client, sql, user_id, grant_id, 0, 900)
    spent = sql("SELECT COALESCE(SUM(amount), 0) FROM t_grant_spend WHERE grant_id = %s", (int(grant_id),))
    assert spent == ((300,),)


def _a_spend_booked_before_its_grant(api, redis_client):
    """(user id, grant id, order id, the grant's record): a deduct that spent 2.00 of a 3.00 grant, booked by the
    writer before the granted recharge, whose record is returned for the test to book."""
    user_id = api.account(balance="10.00")
    _persist(redis_client, user_id)
    grant_id, _ = _grant(api, user_id, "3.00", 3_600_000)
    status, order = api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})  # 2.00 of the grant
    assert status == 200, order
    grant, deduct = ledger_records(redis_client, [user_id])
    assert invoke_writer([deduct]) == {"batchItemFailures": []}  # the spend first
    return user_id, grant_id, order["order_id"], grant


def test_a_spend_booked_before_its_grant_leaves_the_grant_only_what_is_left(api, redis_client, sql):
    """Found by the chaos test: after the broker lost its log, the reconciler persisted an account's older entries (a
    granted recharge among them) after newer ones the new log carried (a deduct that spent that grant). The spend
    found no t_grant row to take from, the grant was then inserted whole, and once Redis lost the account, the rebuilt
    grant's expiry took from the plain balance what the deduct had spent. A grant booked after spends of it starts
    from what they left."""
    user_id, grant_id, _, grant = _a_spend_booked_before_its_grant(api, redis_client)
    assert invoke_writer([grant]) == {"batchItemFailures": []}
    assert sql("SELECT remaining, state FROM t_grant WHERE id = %s", (int(grant_id),)) == ((100, "ACTIVE"),)
    for key in redis_client.scan_iter(match=f"*{{{user_id}}}*"):  # the account's slot, lost whole
        redis_client.delete(key)
    rebuilt_after_the_writer_caught_up(redis_client, user_id)
    assert _remaining(api, user_id) == {grant_id: "1.00"}
    _assert_db_agrees(sql, user_id, 1100)


def test_a_cache_load_while_a_spend_is_booked_before_its_grant_starts_the_grant_from_what_the_spend_left(
    api, redis_client, sql
):
    """As above, with the account's hash dropped (its pending entries kept) before the grant is booked: the load made
    the grant whole from its pending recharge, as the spend booked before it was not there, so its expiry would have
    taken what the spend took from the plain balance. The load starts it from what the booked spends left, as the
    books do (grants/tx.py insert_grant_changes)."""
    user_id, grant_id, _, grant = _a_spend_booked_before_its_grant(api, redis_client)
    redis_client.delete(keys.balance(user_id))
    assert _remaining(api, user_id) == {grant_id: "1.00"}
    assert invoke_writer([grant]) == {"batchItemFailures": []}
    assert sql("SELECT remaining, state FROM t_grant WHERE id = %s", (int(grant_id),)) == ((100, "ACTIVE"),)
    _assert_db_agrees(sql, user_id, 1100)


def test_a_refund_of_a_spend_booked_before_its_grant_waits_for_the_grant_and_gives_it_its_part(api, redis_client, sql):
    """After the broker lost its log, a deduct that spent a grant can be booked before the granted recharge (the
    reconciler persists the older entry later). A refund of the deduct read what it spent through t_grant, found
    nothing, and gave the grant's part back as plain money (promo credit made plain, never to expire). A charge whose
    grants are not booked is not wholly in the books: the refund waits for them (CHARGE_NOT_BOOKED)."""
    user_id, grant_id, order_id, grant = _a_spend_booked_before_its_grant(api, redis_client)
    status, body = api("POST", f"/accounts/{user_id}/orders/{order_id}/refunds", {"amount": "2.00"})
    assert (status, body["error"]["code"]) == (409, "CHARGE_NOT_BOOKED"), body
    assert invoke_writer([grant]) == {"batchItemFailures": []}
    _refund(api, user_id, order_id, "2.00")
    assert _remaining(api, user_id) == {grant_id: "3.00"}
    _booked_with(redis_client, sql, user_id, grant_id, 300, 1300)


def test_a_refund_of_a_hold_waits_for_every_capture_of_it_so_its_plain_part_goes_back_first(api, redis_client, sql):
    """After the broker lost its log, a hold's final capture (spending a grant) can be booked before an older partial
    capture of the plain balance (the reconciler persists the older entry later). A refund read the hold as booked
    then: it had captured the grant's 3.00 only, so a refund of 3.00 went back to the grant, where the whole charge
    gives back its 5.00 of plain balance first. A hold with a change still on its way to the DB is not wholly in the
    books: the refund waits for it (CHARGE_NOT_BOOKED)."""
    user_id = api.account(balance="20.00")
    _persist(redis_client, user_id)
    hold_id = _hold(api, user_id, "8.00")
    assert _capture(api, user_id, hold_id, "5.00")[0] == 200  # of the plain balance
    grant_id, _ = _grant(api, user_id, "3.00", 3_600_000)
    assert _capture(api, user_id, hold_id, "3.00", final=True)[0] == 200  # of the grant
    authorize, partial, grant, final = ledger_records(redis_client, [user_id])
    assert invoke_writer([authorize, grant, final]) == {"batchItemFailures": []}  # the partial capture later
    status, body = api("POST", f"/accounts/{user_id}/holds/{hold_id}/refunds", {"amount": "3.00"})
    assert (status, body["error"]["code"]) == (409, "CHARGE_NOT_BOOKED"), body
    assert invoke_writer([partial]) == {"batchItemFailures": []}
    status, body = api("POST", f"/accounts/{user_id}/holds/{hold_id}/refunds", {"amount": "3.00"})
    assert status == 201, body
    assert _refunds_given_back(api, user_id) == [("3.00", [])]
    assert _remaining(api, user_id) == {}
    _booked_with(redis_client, sql, user_id, grant_id, 0, 1800)
