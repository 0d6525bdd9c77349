"""Recovery that converges (issue 10, item 13): the reconciler repairs a drifted cache while the account is charged
at a high rate, and the money invariant DB + pending == cache holds afterwards."""

import threading

import pytest

from helpers import invoke_writer, ledger_records, reconcile_totals
from hotledger import keys
from hotledger.ledger import feature as ledger_feature
from hotledger.ledger.store import pending_entries


@pytest.fixture
def reconcile(monkeypatch):
    return lambda age_s=3600: reconcile_totals(monkeypatch, age_s)  # a whole pass, whatever each run's budget


def _invariant(sql, redis_client, user_id) -> tuple[int, int]:
    """(cached balance, DB balance + the pending entries the DB does not hold)."""
    db_balance = sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,))[0][0]
    pending = pending_entries(redis_client, user_id)
    held = {
        row[0]
        for row in sql(
            "SELECT id FROM t_pay WHERE user_id = %s UNION SELECT id FROM t_order WHERE user_id = %s",
            (user_id, user_id),
        )
    }
    return int(redis_client.hget(keys.balance(user_id), "balance")), db_balance + sum(
        e.delta for e in pending if e.entry_id not in held
    )


def test_drift_on_a_hot_account_is_repaired_in_one_run(api, sql, redis_client, reconcile):
    user_id = api.account(balance="100.00")
    invoke_writer(ledger_records(redis_client, [user_id]))  # the opening recharge is in the DB
    # a failover lost writes: the cache holds 7.00 too much and the writer flagged it
    redis_client.hincrby(keys.balance(user_id), "balance", 700)
    redis_client.hset(keys.balance(user_id), "dirty", "1")
    ledger, stop, charged = ledger_feature.ledger(), threading.Event(), []

    def charge():  # a hot account: recharges back to back (their events stay pending: no writer runs)
        while not stop.is_set():
            ledger.recharge(user_id, 1)
            charged.append(1)

    thread = threading.Thread(target=charge, daemon=True)
    thread.start()
    try:
        while len(charged) < 20:
            pass
        before = len(charged)
        reconcile()
        assert len(charged) > before, "the account was not charged while the reconciler ran"
    finally:
        stop.set()
        thread.join(10)
    cached, expected = _invariant(sql, redis_client, user_id)
    assert cached == expected, f"drift of {cached - expected} survived a run"
    assert not redis_client.hexists(keys.balance(user_id), "dirty")
    reconcile()  # a run over a right cache changes nothing
    assert _invariant(sql, redis_client, user_id)[0] == expected
