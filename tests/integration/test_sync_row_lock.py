"""SYNC charges decided by the account's row lock alone (issue 33 goal 3): no account lock in Redis around them.

Through the API handler, from threads: deducts of one SYNC account racing each other never take the balance below
its threshold, book a gapless ledger whose balances chain, and fire a balance monitor once; deducts racing a switch
of the account to ASYNC are each made once, SYNC before the switch and ASYNC after it, and the cache the switch
loads holds every SYNC charge."""

import threading

from hotledger.ledger import store

THREADS = 6


def _race(api, user_id: int, per_thread: int) -> tuple[list[tuple[int, dict]], list[threading.Thread]]:
    """THREADS threads of `per_thread` deducts of 1.00 each, started: (their answers as they come, the threads)."""
    answers: list[tuple[int, dict]] = []
    guard = threading.Lock()

    def deducts() -> None:
        for _ in range(per_thread):
            answer = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
            with guard:
                answers.append(answer)

    threads = [threading.Thread(target=deducts) for _ in range(THREADS)]
    for t in threads:
        t.start()
    return answers, threads


def _ledger(sql, user_id: int):
    return sql("SELECT seq, delta, balance_after FROM t_entry WHERE user_id = %s ORDER BY seq", (user_id,))


def test_racing_sync_deducts_stop_at_the_threshold_and_book_a_gapless_ledger(api, sql, monkeypatch):
    user_id = api.account(balance="20.00", deduct_type="SYNC", threshold="5.00")
    status, _ = api("POST", f"/accounts/{user_id}/monitors", {"below": "10.00"})
    assert status == 201
    # every charge waits for the others inside its transaction once it holds the row lock: were the row lock not
    # what serializes them, two would read one balance
    take_lock = store.ChargeReads.of

    def slow_reads(results, subscribers):
        threading.Event().wait(0.005)
        return take_lock(results, subscribers)

    monkeypatch.setattr(store.ChargeReads, "of", staticmethod(slow_reads))
    answers, threads = _race(api, user_id, per_thread=4)
    for t in threads:
        t.join(120)
    made = [body for status, body in answers if status == 200]
    refused = [body["error"]["code"] for status, body in answers if status != 200]
    assert len(made) == 15 and refused == ["INSUFFICIENT_BALANCE"] * (THREADS * 4 - 15), refused
    assert {body["mode"] for body in made} == {"SYNC"}
    versions = sorted(body["version"] for body in made)
    assert versions == list(range(versions[0], versions[0] + 15))  # one version each, none twice
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((500,),)
    ledger = _ledger(sql, user_id)
    assert [seq for seq, _, _ in ledger] == list(range(1, len(ledger) + 1))
    running = 0
    for _, delta, balance_after in ledger:
        running += delta
        assert balance_after == running
    assert running == 500
    alerts = sql("SELECT seq, balance FROM t_monitor_alert WHERE user_id = %s", (user_id,))
    assert [balance for _, balance in alerts] == [900]  # crossed below 10.00 once, by the deduct that left 9.00


def test_deducts_racing_a_switch_to_async_are_each_made_once_sync_before_it(api, sql):
    user_id = api.account(balance="100.00", deduct_type="SYNC")
    answers, threads = _race(api, user_id, per_thread=8)
    while len(answers) < THREADS * 2:  # the switch lands among the deducts, not before or after them all
        threading.Event().wait(0.001)
    status, body = api("PATCH", f"/accounts/{user_id}", {"deduct_type": "ASYNC"})
    assert status == 200, body
    for t in threads:
        t.join(120)
    assert [status for status, _ in answers] == [200] * THREADS * 8, answers
    by_mode = {mode: sorted(b["version"] for _, b in answers if b["mode"] == mode) for mode in ("SYNC", "ASYNC")}
    assert by_mode["SYNC"] and by_mode["SYNC"][-1] < by_mode["ASYNC"][0]  # every SYNC charge before the switch
    assert len({b["order_id"] for _, b in answers}) == THREADS * 8
    # the SYNC charges are in the DB, gapless; the cache the switch loaded holds them all, and the ASYNC ones on top
    assert sql("SELECT COUNT(*), SUM(amount) FROM t_order WHERE user_id = %s AND mode = 'SYNC'", (user_id,)) == (
        (len(by_mode["SYNC"]), 100 * len(by_mode["SYNC"])),
    )
    ledger = _ledger(sql, user_id)
    assert [seq for seq, _, _ in ledger] == list(range(1, len(ledger) + 1))
    account = api("GET", f"/accounts/{user_id}")[1]
    assert account["balance"] == f"{100 - THREADS * 8}.00" and account["deduct_type"] == "ASYNC"


def test_a_sync_charge_on_a_connection_the_db_dropped_since_is_made_on_a_new_one(api, sql):
    """The charge's first round trip is not preceded by a ping: a connection that went away fails it, and it is
    sent again on a new connection (the server ended the old session and the transaction it began)."""
    from hotledger.dal import db

    user_id = api.account(balance="10.00", deduct_type="SYNC")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
    sql("KILL CONNECTION %s", (db.connection().thread_id(),))
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert (status, body.get("balance"), body.get("mode")) == (200, "8.00", "SYNC"), body


def _scripts_run(monkeypatch) -> list[str]:
    """The names of the Lua scripts run from here on, each call let through."""
    from hotledger.dal.redis_store import Lua

    names: list[str] = []
    run = Lua.run

    def spy(self, name, *args, **kwargs):
        names.append(name)
        return run(self, name, *args, **kwargs)

    monkeypatch.setattr(Lua, "run", spy)
    return names


def test_a_sync_account_charged_before_is_charged_in_the_db_without_asking_redis_its_mode(api, monkeypatch):
    """The process remembers the accounts it charged SYNC: the next charge goes straight to the row lock, without the
    script call that would only say SYNC again (issue 33 goal 3: a SYNC request's CPU)."""
    user_id = api.account(balance="10.00", deduct_type="SYNC")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
    scripts = _scripts_run(monkeypatch)
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert (status, body["balance"], body["mode"]) == (200, "8.00", "SYNC"), body
    assert "ledger_apply" not in scripts, scripts


def test_an_account_remembered_sync_and_since_switched_to_async_is_charged_in_redis_and_its_cache_kept(api):
    """The memo is a hint: the mode read under the row lock decides. A process that charged the account SYNC before an
    operator switched it to ASYNC (and other processes charged it in Redis since) charges it the Redis way, on the
    cache as it is: dropping it would make the account a rebuild after a Redis loss, and a keyed charge would wait
    (RECOVERING) for entries the cache never lost."""
    from hotledger import runtime
    from hotledger.ledger.feature import ledger

    user_id = api.account(balance="10.00", deduct_type="SYNC")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
    remembering = ledger()
    assert user_id in remembering.sync_accounts
    assert api("PATCH", f"/accounts/{user_id}", {"deduct_type": "ASYNC"})[0] == 200
    runtime.reset()  # another process: it charges the account in Redis, the entry not in the DB yet
    status, body = api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    assert (status, body["balance"], body["mode"]) == (200, "8.00", "ASYNC"), body
    result = remembering.deduct(user_id, 100, idem_key="after-the-switch")
    assert (result.balance, result.mode) == (700, "ASYNC")
    assert user_id not in remembering.sync_accounts
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "7.00"
