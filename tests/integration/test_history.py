"""Issue 20, history: every balance change is one entry of the account's ledger in the DB with a gapless seq, the
balance and available balance after it; pages newest first with cursors that keep their filters; read your writes
(acknowledged, not yet booked: listed as pending); the balance at any time; statements that add up. Driven through
the API handler and the writer function, on the real Redis, DB and broker."""

import time

import pytest

from helpers import Api, invoke_writer, ledger_records
from hotledger import keys


def _persist(redis_client, user_id):
    assert invoke_writer(ledger_records(redis_client, [user_id])) == {"batchItemFailures": []}


def _entries(api, user_id, query=""):
    status, body = api("GET", f"/accounts/{user_id}/entries{query}")
    assert status == 200, body
    return body


def _minor(text):
    whole, _, frac = text.lstrip("-").partition(".")
    return (-1 if text.startswith("-") else 1) * (int(whole) * 100 + int(frac))


def _ledger(sql, user_id):
    return sql("SELECT seq, delta, balance_after FROM t_entry WHERE user_id = %s ORDER BY seq", (user_id,))


def _assert_ledger_adds_up(sql, user_id):
    """Gapless seq from 1, each balance_after = the previous + delta, the last = t_account.balance and seq."""
    rows = _ledger(sql, user_id)
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    running = 0
    for _, delta, balance_after in rows:
        running += delta
        assert balance_after == running
    assert sql("SELECT balance, seq FROM t_account WHERE user_id = %s", (user_id,))[0] == (running, len(rows))
    return rows


def test_acknowledged_entries_are_listed_at_once_then_booked_with_a_gapless_seq(api, redis_client, sql):
    user_id = api.account(balance="10.00")
    for amount in ("1.00", "2.50"):
        assert (
            api("POST", f"/accounts/{user_id}/deduct", {"amount": amount}, {"Idempotency-Key": f"k-{amount}"})[0] == 200
        )
    pending = _entries(api, user_id)
    assert [(e["type"], e["amount"], e["state"], e["seq"]) for e in pending["entries"]] == [
        ("deduct", "2.50", "pending", None),
        ("deduct", "1.00", "pending", None),
        ("recharge", "10.00", "pending", None),
    ]
    assert pending["entries"][0]["ref"] == "key:k-2.50" and pending["next_cursor"] is None

    _persist(redis_client, user_id)
    booked = _entries(api, user_id)["entries"]
    assert [
        (e["seq"], e["type"], e["balance_change"], e["balance_after"], e["available_after"], e["state"]) for e in booked
    ] == [
        (3, "deduct", "-2.50", "6.50", "6.50", "booked"),
        (2, "deduct", "-1.00", "9.00", "9.00", "booked"),
        (1, "recharge", "10.00", "10.00", "10.00", "booked"),
    ]
    assert all(e["at"] >= e["charged_at"] - 5_000 for e in booked)
    _assert_ledger_adds_up(sql, user_id)
    _persist(redis_client, user_id)  # a replayed batch books nothing twice
    assert len(_assert_ledger_adds_up(sql, user_id)) == 3


def test_pages_are_stable_while_entries_arrive_and_a_cursor_keeps_its_filters(api, redis_client, sql):
    user_id = api.account(balance="50.00")
    for i in range(1, 6):
        assert api("POST", f"/accounts/{user_id}/deduct", {"amount": f"{i}.00"})[0] == 200
    _persist(redis_client, user_id)  # seq 1 recharge, 2..6 deducts of 1..5
    first = _entries(api, user_id, "?limit=2&types=deduct")
    assert [e["seq"] for e in first["entries"]] == [6, 5]
    assert api("POST", f"/accounts/{user_id}/recharge", {"amount": "7.00"})[0] == 200  # arrives between pages
    _persist(redis_client, user_id)
    second = _entries(api, user_id, f"?limit=2&cursor={first['next_cursor']}")  # the filter travels in the cursor
    assert [e["seq"] for e in second["entries"]] == [4, 3]
    third = _entries(api, user_id, f"?limit=2&types=deduct&cursor={second['next_cursor']}")  # the same filter: fine
    assert [e["seq"] for e in third["entries"]] == [2] and third["next_cursor"] is None

    for query in (f"?types=recharge&cursor={first['next_cursor']}", "?cursor=bm90LWEtY3Vyc29y", "?cursor=%%%"):
        status, body = api("GET", f"/accounts/{user_id}/entries{query}")
        assert (status, body["error"]["code"]) == (422, "INVALID_CURSOR"), (query, body)
    other = api.account()
    status, body = api("GET", f"/accounts/{other}/entries?cursor={first['next_cursor']}")
    assert (status, body["error"]["code"]) == (422, "INVALID_CURSOR")
    assert [e["type"] for e in _entries(api, user_id, "?types=recharge")["entries"]] == ["recharge", "recharge"]


def test_balance_at_any_time_and_a_statement_that_adds_up(api, redis_client, sql):
    user_id = api.account(balance="20.00")
    _persist(redis_client, user_id)
    time.sleep(0.01)
    for amount in ("3.00", "4.00"):
        assert api("POST", f"/accounts/{user_id}/deduct", {"amount": amount})[0] == 200
    _persist(redis_client, user_id)
    rows = sql("SELECT seq, booked_at, balance_after FROM t_entry WHERE user_id = %s ORDER BY seq", (user_id,))
    first_at, last_at = rows[0][1], rows[-1][1]
    assert first_at < last_at
    status, body = api("GET", f"/accounts/{user_id}/balance?at={first_at}")
    assert (status, body) == (200, {"balance": "20.00", "available": "20.00", "seq": 1, "at": first_at})
    assert api("GET", f"/accounts/{user_id}/balance?at={first_at - 1}")[1]["seq"] == 0
    assert api("GET", f"/accounts/{user_id}/balance?at={last_at}")[1]["balance"] == "13.00"

    status, whole = api("GET", f"/accounts/{user_id}/statement?since=0&until={last_at + 1}")
    assert status == 200 and whole["opening_balance"] == "0.00" and whole["closing_balance"] == "13.00"
    status, part = api("GET", f"/accounts/{user_id}/statement?since={first_at + 1}&until={last_at + 1}")
    assert part["opening_balance"] == "20.00" and [e["seq"] for e in part["entries"]] == [2, 3]
    for statement in (whole, part):
        assert _minor(statement["opening_balance"]) + sum(
            _minor(e["balance_change"]) for e in statement["entries"]
        ) == _minor(statement["closing_balance"])


def test_seq_stays_gapless_and_unique_across_a_redis_loss_and_a_sync_switch(api, redis_client, sql):
    """Entries acknowledged by a Redis that then lost the account reach the DB after entries charged from the
    reloaded cache: the DB books both, each once, in one gapless sequence; then SYNC charges continue it."""
    user_id = api.account(balance="30.00")
    _persist(redis_client, user_id)
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
    late = ledger_records(redis_client, [user_id])  # still in the broker when Redis loses the account
    redis_client.delete(keys.balance(user_id), keys.pending(user_id), keys.held(user_id))
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})[0] == 200  # charged from a fresh load
    _persist(redis_client, user_id)
    assert invoke_writer(late) == {"batchItemFailures": []}
    rows = _assert_ledger_adds_up(sql, user_id)
    assert sorted(r[1] for r in rows) == [-200, -100, 3000]

    assert api("PATCH", f"/accounts/{user_id}", {"deduct_type": "SYNC"})[0] == 200
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    assert status == 200 and body["mode"] == "SYNC"
    rows = _assert_ledger_adds_up(sql, user_id)
    assert rows[-1] == (4, -400, 2300)
    assert _entries(api, user_id, "?limit=1")["entries"][0]["seq"] == 4  # booked at once: nothing pending


@pytest.mark.parametrize(
    "query, status, code",
    [
        ("/entries?limit=0", 422, "VALIDATION_ERROR"),
        ("/entries?limit=1001", 422, "VALIDATION_ERROR"),
        ("/entries?types=deduct,bogus", 422, "VALIDATION_ERROR"),
        ("/entries?since=5&until=5", 422, "INVALID_RANGE"),
        ("/balance", 422, "MISSING_FIELD"),
        ("/balance?at=-1", 422, "VALIDATION_ERROR"),
        ("/statement?since=10&until=5", 422, "INVALID_RANGE"),
        ("/statement?since=1", 422, "MISSING_FIELD"),
    ],
)
def test_bad_history_requests_get_a_clear_4xx(api, query, status, code):
    user_id = api.account()
    got, body = api("GET", f"/accounts/{user_id}{query}")
    assert (got, body["error"]["code"]) == (status, code), body


def test_unknown_accounts_and_other_users(api):
    status, body = api("GET", "/accounts/2147483000/entries")
    assert (status, body["error"]["code"]) == (404, "ACCOUNT_NOT_FOUND")
    alice, bob = api.account(balance="1.00"), api.account()
    assert Api(user_id=alice, scopes=())("GET", f"/accounts/{alice}/entries")[0] == 200
    assert Api(user_id=bob, scopes=())("GET", f"/accounts/{alice}/entries")[0] == 403


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_balance_at_never_counts_a_hold_past_its_expiry(api, redis_client, sql, deduct_type):
    """Issue 31, hole 6: a hold of 40.00 on 100.00 expiring at T, a deduct right after: balance?at=T+1ms answered
    available 60.00 until the expiry's entry was booked. An expired hold keeps nothing, tidied or not."""
    user_id = api.account(balance="100.00", deduct_type=deduct_type)
    status, hold = api("POST", f"/accounts/{user_id}/holds", {"amount": "40.00", "expires_in_s": 1})
    assert status == 201, hold
    expires_at = int(hold["expires_at"])
    time.sleep(max(0.0, (expires_at - time.time() * 1000) / 1000) + 0.05)
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "10.00"})[0] == 200
    _persist(redis_client, user_id)
    ((booked_at,),) = sql("SELECT MAX(booked_at) FROM t_entry WHERE user_id = %s", (user_id,))
    status, body = api("GET", f"/accounts/{user_id}/balance?at={booked_at}")
    assert (status, body["balance"], body["available"]) == (200, "90.00", "90.00"), body
    if deduct_type == "SYNC":  # booked at once: held before its expiry
        before = api("GET", f"/accounts/{user_id}/balance?at={expires_at - 1}")[1]
        assert before["available"] == "60.00", before


def test_an_entry_booked_between_the_pending_read_and_the_page_read_is_listed_once(api, redis_client, monkeypatch):
    """Issue 31, hole 6: the writer committed an entry after the history read what was pending and before it read the
    booked page: the entry was listed twice, once pending and once booked."""
    from hotledger.history.store import HistoryStore

    user_id = api.account(balance="20.00")
    _persist(redis_client, user_id)
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"})[0] == 200
    page = HistoryStore.page

    def booked_meanwhile(self, *args, **kwargs):
        _persist(redis_client, user_id)  # the writer commits right before the page is read
        return page(self, *args, **kwargs)

    monkeypatch.setattr(HistoryStore, "page", booked_meanwhile)
    ids = [e["entry_id"] for e in _entries(api, user_id)["entries"]]
    assert len(ids) == len(set(ids)) == 2, ids


def test_the_balance_before_an_opening_entry_is_refused_not_zero(api, sql):
    """Hole 6's last read: an account that held money before the ledger existed starts it with one opening entry
    (migration 019). Before that entry the ledger knows nothing: `balance?at=` and a statement reaching back there
    answer 422 BEFORE_LEDGER naming where the ledger starts, never a balance of 0."""
    user_id = api.account()
    opened_at = int(time.time() * 1000) - 60_000
    sql(
        "INSERT INTO t_entry (user_id, seq, entry_id, type, amount, delta, balance_after, available_after, booked_at,"
        " charged_at) VALUES (%s, 1, %s, 'opening', 5000, 5000, 5000, 5000, %s, %s)",
        (user_id, -user_id, opened_at, opened_at),
    )
    sql("UPDATE t_account SET balance = 5000, seq = 1, booked_at = %s WHERE user_id = %s", (opened_at, user_id))

    status, body = api("GET", f"/accounts/{user_id}/balance?at={opened_at}")
    assert (status, body) == (200, {"balance": "50.00", "available": "50.00", "seq": 1, "at": opened_at})
    status, body = api("GET", f"/accounts/{user_id}/balance?at={opened_at - 1}")
    assert status == 422 and body["error"]["code"] == "BEFORE_LEDGER" and str(opened_at) in body["error"]["message"], (
        body
    )
    status, body = api("GET", f"/accounts/{user_id}/statement?since={opened_at - 10}&until={opened_at + 1}")
    assert status == 422 and body["error"]["code"] == "BEFORE_LEDGER", body
    status, body = api("GET", f"/accounts/{user_id}/statement?since={opened_at + 1}&until={opened_at + 2}")
    assert status == 200 and body["opening_balance"] == body["closing_balance"] == "50.00", body
