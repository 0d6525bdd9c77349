"""The reconciler function driven with EventBridge scheduled events, against real Redis and DB."""

import json

import pytest

from helpers import EVENTS, invoke_writer, reconcile_totals, signed_value
from hotledger import keys
from hotledger.ledger.store import pending_entries
from infra.localrt import events


@pytest.fixture
def reconcile(monkeypatch):
    """A whole reconciler pass (as many runs as their budgets take: RECONCILE_PART_ITEMS=1 makes it many), summed."""
    return lambda age_s=0: reconcile_totals(monkeypatch, age_s)


def _db_balance(sql, user_id):
    return sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,))[0][0]


def test_stale_pending_entries_are_compensated_exactly_once(api, sql, redis_client, reconcile):
    """The events never reached the writer (lost by the broker): the entries in Redis are persisted."""
    user_id = api.account(balance="30.00")
    ids = [api("POST", f"/accounts/{user_id}/deduct", {"amount": "5.00"})[1]["order_id"] for _ in range(2)]
    report = reconcile(age_s=3600)
    assert report["pending"] >= 3 and report["compensated"] == 0 and report["oldest_pending_age_s"] >= 0
    report = reconcile(age_s=0)
    assert report["compensated"] >= 3
    assert _db_balance(sql, user_id) == 2000
    assert sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((2,),)
    assert redis_client.zcard(keys.pending(user_id)) == 0
    assert [api("GET", f"/accounts/{user_id}/orders/{i}")[1]["status"] for i in ids] == ["PERSISTED"] * 2
    reconcile(age_s=0)
    assert _db_balance(sql, user_id) == 2000


def test_cache_that_lost_writes_is_restored_from_the_db(api, sql, redis_client, reconcile):
    """Redis failed over and lost the account (and its pending entries) while their events were in flight."""
    user_id = api.account(balance="50.00")
    api("POST", f"/accounts/{user_id}/deduct", {"amount": "10.00"})
    in_flight = [
        (0, i, b"k", signed_value(e.to_event().model_dump()))
        for i, e in enumerate(sorted(pending_entries(redis_client, user_id), key=lambda e: e.version))
    ]
    redis_client.delete(keys.balance(user_id), keys.pending(user_id))
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "0.00"  # reloaded from the DB: nothing persisted yet
    assert api("POST", f"/accounts/{user_id}/recharge", {"amount": "5.00"})[0] == 200
    invoke_writer(in_flight)  # the in-flight events arrive after the reload
    assert redis_client.hget(keys.balance(user_id), "dirty") == b"1"
    report = reconcile(age_s=3600)
    assert report["corrected"] >= 1
    account = api("GET", f"/accounts/{user_id}")[1]
    assert account["balance"] == "45.00"  # 50 - 10 + 5: nothing acknowledged is lost
    invoke_writer(
        [(0, 9, b"k", signed_value(e.to_event().model_dump())) for e in pending_entries(redis_client, user_id)]
    )
    assert _db_balance(sql, user_id) == 4500
    reconcile(age_s=3600)
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "45.00"


def test_cache_behind_the_db_version_is_corrected(api, sql, redis_client, reconcile):
    user_id = api.account(balance="20.00")
    invoke_writer(
        [(0, 0, b"k", signed_value(e.to_event().model_dump())) for e in pending_entries(redis_client, user_id)]
    )
    sql("UPDATE t_account SET version = version + 100, balance = balance + 700 WHERE user_id = %s", (user_id,))
    reconcile(age_s=3600)
    account = api("GET", f"/accounts/{user_id}")[1]
    assert account["balance"] == "27.00" and account["version"] > 100


def test_cache_balance_drifted_at_the_same_version_is_corrected(api, sql, redis_client, reconcile):
    """Redis holds a balance that disagrees with DB + pending entries while its version and dirty flag look fine
    (a write lost or doubled in a failover): the balance comparison alone finds it (a mutant comparing only the
    version and the dirty flag survived before)."""
    user_id = api.account(balance="20.00")
    invoke_writer(
        [(0, 0, b"k", signed_value(e.to_event().model_dump())) for e in pending_entries(redis_client, user_id)]
    )
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200  # one entry still pending
    version = int(redis_client.hget(keys.balance(user_id), "v"))
    redis_client.hincrby(keys.balance(user_id), "balance", 300)
    assert not redis_client.hget(keys.balance(user_id), "dirty")
    assert reconcile(age_s=3600)["corrected"] >= 1
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "19.00"  # 20 - 1, the drift of 3.00 is gone
    assert int(redis_client.hget(keys.balance(user_id), "v")) >= version
    assert _db_balance(sql, user_id) == 2000


def test_a_sync_accounts_cache_serves_its_mode_and_its_balance_decides_nothing(api, sql, redis_client, reconcile):
    """A SYNC charge does not update the cache (its balance stays as the last load left it) and the reconciler leaves
    it: reads, charges and a switch to ASYNC take the DB's balance, never the cache's."""
    user_id = api.account(deduct_type="SYNC", balance="20.00")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
    loaded = redis_client.hgetall(keys.balance(user_id))
    assert loaded[b"mode"] == b"SYNC"
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"})[0] == 200
    assert redis_client.hgetall(keys.balance(user_id)) == loaded  # no Redis write for a SYNC charge
    reconcile(age_s=3600)
    assert redis_client.hgetall(keys.balance(user_id)) == loaded
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "17.00"
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "17.01"})[1]["error"]["code"] == "INSUFFICIENT_BALANCE"
    assert api("PATCH", f"/accounts/{user_id}", {"deduct_type": "ASYNC"})[0] == 200
    assert int(redis_client.hget(keys.balance(user_id), "balance")) == 1700  # reloaded from the DB at the switch
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "17.00"})[0] == 200
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"})[1]["error"]["code"] == "API_CLOSED"  # at 0


def test_sample_scheduled_event_file(reconcile):
    from reconciler.app import handler

    report = handler(
        json.loads((EVENTS / "reconciler_schedule.json").read_text()), events.LambdaContext("ReconcilerFunction")
    )
    assert {"pending", "oldest_pending_age_s", "compensated", "corrected", "deferred"} <= set(report)
    assert report["accounts"] >= 1


# key records have a retention (issue 19, item 16) -----------------------------------------------------------------
def test_key_and_rollback_records_past_their_retention_are_pruned_and_younger_ones_kept(api, sql, monkeypatch):
    from hotledger.runtime import reconciler, settings

    user = api.account(balance="10.00", deduct_type="SYNC")  # a SYNC charge keeps its key's answer in t_idempotency
    assert api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, {"Idempotency-Key": "old"})[0] == 200
    assert api("POST", f"/accounts/{user}/deduct", {"amount": "1.00"}, {"Idempotency-Key": "young"})[0] == 200
    sender = api.account(balance="10.00")
    assert (
        api("POST", "/redpackets", {"sender_id": sender, "total": "1.00", "count": 1}, {"Idempotency-Key": "old"})[0]
        == 201
    )
    days = settings().key_retention_days
    assert days == 30  # the default
    for table, column, value in (("t_idempotency", "user_id", user), ("t_route_key", "scope", f"account:{sender}")):
        sql(
            f"UPDATE {table} SET create_time = NOW(3) - INTERVAL %s DAY WHERE {column} = %s AND idem_key = 'c:old'"
            if table == "t_idempotency"
            else f"UPDATE {table} SET create_time = NOW(3) - INTERVAL %s DAY WHERE {column} = %s AND idem_key = 'old'",
            (days + 1, value),
        )
    prune_keys = next(part.run for part in reconciler().parts if part.name == "keys")
    monkeypatch.setattr(prune_keys, "retention_ms", (days + 5) * 86_400_000)  # a longer retention keeps them
    reconcile_totals()
    assert sql("SELECT COUNT(*) FROM t_idempotency WHERE user_id = %s", (user,)) == ((2,),)
    monkeypatch.setattr(prune_keys, "retention_ms", days * 86_400_000)
    report = reconcile_totals()
    assert report["keys_pruned"] >= 2
    assert sql("SELECT idem_key FROM t_idempotency WHERE user_id = %s", (user,)) == (("c:young",),)
    assert sql("SELECT COUNT(*) FROM t_route_key WHERE scope = %s", (f"account:{sender}",)) == ((0,),)
