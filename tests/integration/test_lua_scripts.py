"""Every Lua script, every branch, against a real Redis."""

import itertools
from pathlib import Path

import pytest
from redis.crc import key_slot

from hotledger import keys
from hotledger.dal.redis_store import Lua, RedisCommandError, script_text

_ids = itertools.count(1)
MAX_BALANCE = 9_000_000_000_000_000


@pytest.fixture
def lua(redis_client, settings) -> Lua:
    return Lua(redis_client, settings.lua_dir)


@pytest.fixture
def uid():
    return 10_000_000 + next(_ids)


def _load(
    lua,
    uid,
    balance=10_000,
    version=5,
    threshold=0,
    open_="1",
    mode="ASYNC",
    epoch="e1",
    hold_until=0,
    hold_log="",
    grants="",
):
    return lua.run(
        "ledger_load",
        keys=[
            keys.balance(uid),
            keys.held(uid),
            keys.holds(uid),
            keys.hold_expiry(uid),
            keys.refunds(uid),
            keys.grants(uid),
            keys.grant_expiry(uid),
        ],
        args=[balance, version, threshold, open_, mode, epoch, hold_until, hold_log, 0, "", grants],
    )


def _apply(
    lua,
    uid,
    kind,
    amount,
    entry_id,
    fingerprint="",
    idem="k",
    stale_before=0,
    key_checked=True,
    refusal_final=True,
    grant=None,
):
    reply = lua.run(
        "ledger_apply",
        keys=[
            keys.balance(uid),
            keys.entry(uid, entry_id),
            keys.pending(uid),
            keys.idempotency(uid, idem),
            keys.account_stream(uid),
            keys.idempotency_quota(uid),
            keys.held(uid),
            keys.holds(uid),
            keys.hold_expiry(uid),
            keys.grants(uid),
            keys.grant_expiry(uid),
        ],
        args=[
            kind,
            amount,
            1_700_000_000_000 + entry_id,
            entry_id,
            3600,
            fingerprint,
            3600,
            MAX_BALANCE,
            stale_before,
            "",
            "",
            uid,
            "checked" if key_checked else "",
            "1" if refusal_final else "",
            *(("", "", *grant) if grant else ()),  # a granted recharge: its expires_at and category
        ],
    )
    return [x.decode() if isinstance(x, bytes) else x for x in reply]


def test_all_keys_of_an_account_share_one_cluster_slot():
    uid = 42
    slots = {
        key_slot(k.encode())
        for k in (
            keys.balance(uid),
            keys.entry(uid, 1),
            keys.pending(uid),
            keys.fate(uid, 1),
            keys.idempotency(uid, "x"),
            keys.idempotency_quota(uid),
            keys.held(uid),
            keys.holds(uid),
            keys.hold_expiry(uid),
            keys.refunds(uid),
            keys.grants(uid),
            keys.grant_expiry(uid),
        )
    }
    assert len(slots) == 1


def test_every_script_compiles_without_the_library_functions_it_never_calls(lua, settings):
    """script_text leaves out the functions a script never calls (issue 33 goal 2): Redis still compiles what is
    left, so no function kept names one left out."""
    for path in sorted(Path(settings.lua_dir).glob("*.lua")):
        assert lua.client.script_load(script_text(path)) == lua.sha(path.stem), path.stem


def test_missing_account_asks_for_a_load(lua, uid):
    assert _apply(lua, uid, "D", 100, 1) == ["missing"]


def test_load_creates_only_if_absent(lua, redis_client, uid):
    assert _load(lua, uid, balance=500) == 1
    assert _load(lua, uid, balance=999) == 0
    assert redis_client.hget(keys.balance(uid), "balance") == b"500"


def _commands_sent(redis_client) -> dict:
    return {
        name.removeprefix("cmdstat_"): stat["calls"]
        for name, stat in redis_client.info("commandstats").items()
        if not name.startswith(("cmdstat_eval", "cmdstat_config", "cmdstat_script"))  # the test's own
    }


def test_a_plain_deduct_costs_redis_five_commands(lua, redis_client, uid):
    """A deduct on an account without holds, grants or an Idempotency-Key is Redis's one-thread work per charge on a
    hot account (issue 33 goal 2): its script sends five commands, the account's hash read once (whether it has grants
    is a field of it, not an EXISTS of the grants' key) and written once (the balance and the version computed in the
    script, exact below MAX_BALANCE, not two HINCRBYs and an HSET)."""
    _load(lua, uid, balance=10_000, version=5)
    redis_client.config_resetstat()
    assert _apply(lua, uid, "D", 1234, 78)[:4] == ["ok", "78", "8766", "6"]
    assert _commands_sent(redis_client) == {"get": 1, "hmget": 1, "hset": 1, "set": 1, "zadd": 1}
    assert redis_client.hmget(keys.balance(uid), "balance", "v") == [b"8766", b"6"]


def test_an_account_cached_before_its_grants_flag_existed_still_spends_its_grants_first(lua, redis_client, uid):
    """The account's `grants` field is written by grant_add, the only writer of the grants' expiry zset; an account
    cached by an earlier release has grants and no field: its first debit looks the grants up once and keeps the
    answer, so promo credit is still spent first (and an expired grant's money is still out of reach)."""
    far = 4_102_444_800_000  # 2100-01-01
    _load(lua, uid, balance=10_000, version=5, grants=f"900:300:{far}:promo")
    assert redis_client.hget(keys.balance(uid), "grants") == b"1"
    redis_client.hdel(keys.balance(uid), "grants")  # as an earlier release cached it
    assert _apply(lua, uid, "D", 100, 78)[6] == "900:100"
    assert redis_client.hget(keys.balance(uid), "grants") == b"1"
    redis_client.config_resetstat()
    assert _apply(lua, uid, "D", 100, 79)[6] == "900:100"
    assert "exists" not in _commands_sent(redis_client)


def test_an_account_loaded_without_grants_says_so_and_a_granted_recharge_turns_it_on(lua, redis_client, uid):
    far = 4_102_444_800_000
    _load(lua, uid, balance=10_000, version=5)
    assert redis_client.hget(keys.balance(uid), "grants") == b"0"
    assert _apply(lua, uid, "D", 100, 78)[6] == ""
    assert _apply(lua, uid, "R", 500, 79, grant=(far, "promo"))[0] == "ok"
    assert redis_client.hget(keys.balance(uid), "grants") == b"1"
    assert lua.run("ledger_post", [keys.balance(uid), keys.held(uid), keys.holds(uid)], [79]) == 1  # durable
    assert _apply(lua, uid, "D", 100, 80)[6] == "79:100"


def test_a_plain_only_debit_keeps_the_live_grants_out_of_reach_and_spends_none(lua, redis_client, uid):
    """A transfer's debit (kind T, plain_only) reaches the plain balance only: the live grants' remaining is out of its
    reach, and a grant whose credit is still held is out of reach once (as held credit), not twice; it spends no
    grant. A deduct (D) of the same account still spends the grants first."""
    far = 4_102_444_800_000
    _load(lua, uid, balance=1_000, version=5, grants=f"900:300:{far}:promo")  # 700 plain, 300 granted
    assert _apply(lua, uid, "T", 701, 1) == ["insufficient", "1000", "5"]
    assert _apply(lua, uid, "R", 200, 2, grant=(far, "promo"))[0] == "ok"  # a grant held until durable
    assert _apply(lua, uid, "T", 701, 3)[0] == "insufficient"
    assert _apply(lua, uid, "T", 700, 4)[:3] + _apply(lua, uid, "T", 700, 4)[6:] == ["ok", "4", "500", ""]
    assert redis_client.get(keys.entry(uid, 4)).decode().split(";")[4] == "T"
    assert {k.decode(): v.decode().split(";")[0] for k, v in redis_client.hgetall(keys.grants(uid)).items()} == {
        "900": "300",
        "2": "200",
    }
    assert _apply(lua, uid, "D", 100, 5)[6] == "900:100"


def test_deduct_ok_writes_entry_zset_and_bumps_version(lua, redis_client, uid):
    _load(lua, uid, balance=10_000, version=5, epoch="ep")
    assert _apply(lua, uid, "D", 1234, 77) == ["ok", "77", "8766", "6", "ep", "1", ""]  # no grant spent
    assert redis_client.get(keys.entry(uid, 77)).decode().split(";")[0::2] == ["1234", "8766", "D", "1"]
    assert redis_client.zscore(keys.pending(uid), "77") is not None
    assert 0 < redis_client.ttl(keys.entry(uid, 77)) <= 3600


def test_deduct_below_threshold_is_refused_and_changes_nothing(lua, redis_client, uid):
    _load(lua, uid, balance=1000, threshold=300)
    assert _apply(lua, uid, "D", 701, 1) == ["insufficient", "1000", "5"]
    assert _apply(lua, uid, "D", 700, 2)[0] == "ok"
    assert redis_client.hget(keys.balance(uid), "balance") == b"300"
    assert redis_client.zcard(keys.pending(uid)) == 1


def test_deduct_to_zero_closes_and_recharge_reopens(lua, redis_client, uid):
    _load(lua, uid, balance=100)
    assert _apply(lua, uid, "D", 100, 1)[5] == "BALANCE"
    assert _apply(lua, uid, "D", 1, 2) == ["closed", "0", "6"]
    assert _apply(lua, uid, "R", 50, 3)[5] == "1"
    assert _apply(lua, uid, "D", 50, 4)[0] == "insufficient"  # the credit is held until its event is durable
    assert lua.run("ledger_post", [keys.balance(uid), keys.held(uid), keys.holds(uid)], [3]) == 1
    assert _apply(lua, uid, "D", 50, 4)[0] == "ok"


def test_recharge_does_not_reopen_an_operator_close(lua, uid):
    _load(lua, uid, balance=0, open_="ADMIN")
    assert _apply(lua, uid, "R", 50, 1)[5] == "ADMIN"
    assert _apply(lua, uid, "D", 1, 2)[0] == "closed"


def test_recharge_past_the_largest_balance_is_refused(lua, uid):
    _load(lua, uid, balance=MAX_BALANCE - 10)
    assert _apply(lua, uid, "R", 11, 1)[0] == "limit"
    assert _apply(lua, uid, "R", 10, 2)[0] == "ok"


def test_sync_account_is_routed_to_the_db(lua, uid):
    _load(lua, uid, mode="SYNC")
    assert _apply(lua, uid, "D", 1, 1) == ["sync"]


def test_idempotency_replay_conflict_and_in_progress(lua, redis_client, uid):
    _load(lua, uid, balance=1000)
    first = _apply(lua, uid, "D", 100, 1, fingerprint="fp-a")
    assert first[0] == "ok"
    assert _apply(lua, uid, "D", 100, 2, fingerprint="fp-a") == ["in_progress"]
    redis_client.hset(keys.idempotency(uid, "k"), "state", "done")
    assert _apply(lua, uid, "D", 100, 3, fingerprint="fp-a") == ["replay", "1", "900", "6", "done"]
    assert _apply(lua, uid, "D", 200, 4, fingerprint="fp-b") == ["conflict"]
    assert redis_client.hget(keys.balance(uid), "balance") == b"900"


def test_a_key_redis_has_no_record_of_is_looked_up_in_the_db_before_charging(lua, redis_client, uid):
    _load(lua, uid, balance=1000)
    assert _apply(lua, uid, "D", 100, 1, fingerprint="fp", key_checked=False) == ["unknown_key"]
    assert redis_client.hget(keys.balance(uid), "balance") == b"1000" and not redis_client.exists(
        keys.idempotency(uid, "k")
    )
    assert _apply(lua, uid, "D", 100, 1, fingerprint="fp")[0] == "ok"  # the DB had no answer: charge
    redis_client.hset(keys.idempotency(uid, "k"), "state", "done")
    assert (
        _apply(lua, uid, "D", 100, 2, fingerprint="fp", key_checked=False)[0] == "replay"
    )  # Redis knows it: no DB read
    assert _apply(lua, uid, "D", 100, 3, key_checked=False)[0] == "ok"  # no key, nothing to look up


def test_a_rebuilt_account_holds_a_key_neither_redis_nor_the_db_knows_until_the_log_is_applied(lua, redis_client, uid):
    ts = 1_700_000_000_000  # _apply charges entry n at ts + n
    _load(lua, uid, balance=1000, hold_until=ts + 10, hold_log="await")
    assert _apply(lua, uid, "D", 100, 1, fingerprint="fp", key_checked=False) == ["unknown_key"]  # the DB first
    assert _apply(lua, uid, "D", 100, 2, fingerprint="fp") == ["recovering", str(ts + 10)]  # the time hold
    assert _apply(lua, uid, "D", 100, 3)[0] == "ok"  # no key, no answer to contradict
    assert _apply(lua, uid, "D", 100, 11, fingerprint="fp") == ["held", str(ts + 11 + 1000)]  # this caller checks
    assert _apply(lua, uid, "D", 100, 12, fingerprint="fp") == ["recovering", str(ts + 11 + 1000)]  # the others wait
    assert redis_client.hget(keys.balance(uid), "balance") == b"900"
    redis_client.hdel(keys.balance(uid), "hold_log")  # the log hold lifted, as outbox_hold_swap does
    redis_client.hset(keys.balance(uid), "hold_until", 0)
    assert _apply(lua, uid, "D", 100, 13, fingerprint="fp")[0] == "ok"


@pytest.mark.parametrize(
    "load,kind,amount,refused,then",
    [
        ({"balance": 1000, "threshold": 300}, "D", 701, ["insufficient", "1000", "5"], {"balance": "5000"}),
        ({"balance": 1000, "open_": "ADMIN"}, "D", 1, ["closed", "1000", "5"], {"open": "1"}),
        ({"balance": MAX_BALANCE - 10}, "R", 11, ["limit", str(MAX_BALANCE - 10), "5"], {"balance": "0"}),
    ],
)
def test_a_refusal_is_the_keys_answer_and_replayed_as_first_given(
    lua, redis_client, uid, load, kind, amount, refused, then
):
    _load(lua, uid, **load)
    assert _apply(lua, uid, kind, amount, 1, fingerprint="fp") == refused
    redis_client.hset(keys.balance(uid), mapping=then)  # the charge would pass now
    assert _apply(lua, uid, kind, amount, 2, fingerprint="fp", key_checked=False) == refused
    assert _apply(lua, uid, kind, amount + 1, 3, fingerprint="fp-other") == ["conflict"]
    assert redis_client.zcard(keys.pending(uid)) == 0 and redis_client.ttl(keys.idempotency(uid, "k")) > 0
    assert _apply(lua, uid, kind, amount, 4, idem="other")[0] == "ok"  # without a key: decided afresh


def test_without_a_key_or_for_a_service_key_a_refusal_records_nothing(lua, redis_client, uid):
    _load(lua, uid, balance=10)
    assert _apply(lua, uid, "D", 11, 1)[0] == "insufficient"
    assert _apply(lua, uid, "D", 11, 2, fingerprint="fp", refusal_final=False)[0] == "insufficient"
    assert not redis_client.exists(keys.idempotency(uid, "k"))


def test_an_operators_open_flag_takes_a_version_above_the_cache_and_the_db(lua, redis_client, uid):
    assert lua.run("ledger_set_open", [keys.balance(uid)], ["ADMIN", 3]) == 0  # not cached: nothing created
    assert not redis_client.exists(keys.balance(uid))
    _load(lua, uid, version=5)
    assert lua.run("ledger_set_open", [keys.balance(uid)], ["ADMIN", 3]) == 6
    assert lua.run("ledger_set_open", [keys.balance(uid)], ["1", 9]) == 10
    assert redis_client.hmget(keys.balance(uid), "v", "open") == [b"10", b"1"]


def test_a_resent_call_charges_once(lua, redis_client, uid):
    """redis-py resends a script after a timeout: the same entry id answers as the first run did (so the
    caller publishes it), with no second charge."""
    _load(lua, uid, balance=1000)
    first = _apply(lua, uid, "D", 100, 1)
    assert first == ["ok", "1", "900", "6", "e1", "1", ""]
    assert _apply(lua, uid, "D", 100, 1) == first
    assert redis_client.hmget(keys.balance(uid), "balance", "v") == [b"900", b"6"]
    assert redis_client.zcard(keys.pending(uid)) == 1


def test_a_stale_pending_idempotency_record_replays_the_charge(lua, redis_client, uid):
    """The first request died between its charge and the broker's answer: the charge stands."""
    _load(lua, uid, balance=1000)
    assert _apply(lua, uid, "D", 100, 1, fingerprint="fp")[0] == "ok"
    assert _apply(lua, uid, "D", 100, 2, fingerprint="fp", stale_before=1_700_000_000_001) == ["in_progress"]
    assert _apply(lua, uid, "D", 100, 3, fingerprint="fp", stale_before=1_700_000_000_002) == [
        "replay",
        "1",
        "900",
        "6",
        "pending",
    ]
    assert redis_client.hget(keys.balance(uid), "balance") == b"900"


def _rollback(lua, uid, entry_id, idem="k"):
    reply = lua.run(
        "ledger_rollback",
        keys=[
            keys.balance(uid),
            keys.entry(uid, entry_id),
            keys.pending(uid),
            keys.fate(uid, entry_id),
            keys.idempotency(uid, idem),
            keys.idempotency_quota(uid),
            keys.held(uid),
            keys.holds(uid),
            keys.hold_expiry(uid),
            keys.refunds(uid),
            keys.grants(uid),
            keys.grant_expiry(uid),
        ],
        args=[entry_id, 3600, ""],
    )
    return [x.decode() if isinstance(x, bytes) else x for x in reply]


def test_rollback_refunds_tombstones_and_frees_the_idempotency_key(lua, redis_client, uid):
    _load(lua, uid, balance=100)
    _apply(lua, uid, "D", 100, 9, fingerprint="fp")
    assert _rollback(lua, uid, 9) == ["rolled_back", "100", "7"]
    assert redis_client.hget(keys.balance(uid), "open") == b"1"
    assert redis_client.get(keys.fate(uid, 9)) == b"rolledback"
    assert not redis_client.exists(keys.entry(uid, 9), keys.idempotency(uid, "k"))
    assert redis_client.zcard(keys.pending(uid)) == 0
    assert _rollback(lua, uid, 9) == ["gone"]


def test_rollback_of_a_recharge_takes_the_money_back(lua, redis_client, uid):
    _load(lua, uid, balance=0, open_="BALANCE")
    _apply(lua, uid, "R", 300, 1)
    assert _rollback(lua, uid, 1) == ["rolled_back", "0", "7"]
    assert redis_client.hget(keys.balance(uid), "open") == b"BALANCE"


def test_rollback_after_the_writer_claimed_still_gives_the_money_back(lua, redis_client, uid):
    """The DB decided (t_rolled_back, under the account row lock) before the script runs: a writer that claimed
    the entry in Redis finds the DB record and skips it, so the money must come back in Redis."""
    _load(lua, uid, balance=100)
    _apply(lua, uid, "D", 40, 5)
    assert lua.run("outbox_claim", keys=[keys.fate(uid, 5)], args=[3600]) == [1]
    assert _rollback(lua, uid, 5) == ["rolled_back", "100", "7"]
    assert redis_client.get(keys.fate(uid, 5)) == b"rolledback"


def test_claim_skips_rolled_back_entries(lua, uid):
    _load(lua, uid, balance=100)
    _apply(lua, uid, "D", 40, 5)
    _rollback(lua, uid, 5)
    assert lua.run("outbox_claim", keys=[keys.fate(uid, 5), keys.fate(uid, 6)], args=[3600]) == [0, 1]


def test_rollback_when_the_hash_was_lost(lua, redis_client, uid):
    _load(lua, uid, balance=100)
    _apply(lua, uid, "D", 40, 5)
    redis_client.delete(keys.balance(uid))
    assert _rollback(lua, uid, 5) == ["rolled_back"]
    assert not redis_client.exists(keys.balance(uid))


def test_settle_removes_entries_and_flags_foreign_epochs(lua, redis_client, uid):
    _load(lua, uid, balance=100, epoch="new")
    _apply(lua, uid, "D", 10, 1)
    _apply(lua, uid, "D", 10, 2)
    assert lua.run(
        "ledger_settle",
        keys=[keys.pending(uid), keys.balance(uid), keys.held(uid), keys.holds(uid), keys.entry(uid, 1)],
        args=["new"],
    ) == [1, 0]
    assert redis_client.get(keys.entry(uid, 1)).startswith(b"settled;")  # resend evidence only, not pending
    assert redis_client.hget(keys.balance(uid), "dirty") is None
    assert lua.run(
        "ledger_settle",
        keys=[keys.pending(uid), keys.balance(uid), keys.held(uid), keys.holds(uid), keys.entry(uid, 2)],
        args=["new,old"],
    ) == [1, 1]
    assert redis_client.hget(keys.balance(uid), "dirty") == b"1"


def test_reconcile_adds_the_drift_unless_the_cache_was_reloaded(lua, redis_client, uid):
    _load(lua, uid, balance=100, version=5, epoch="e1")
    redis_client.hset(keys.balance(uid), "dirty", "1")
    assert lua.run("ledger_reconcile", keys=[keys.balance(uid)], args=["e0", -70, 9]) == [b"changed"]  # another load
    assert lua.run("ledger_reconcile", keys=[keys.balance(uid)], args=["e1", 0, 5]) == [b"same"]
    assert redis_client.hget(keys.balance(uid), "dirty") is None
    _apply(lua, uid, "R", 30, 1)  # a charge after the snapshot the drift was computed from keeps counting
    assert lua.run("ledger_reconcile", keys=[keys.balance(uid)], args=["e1", -100, 9]) == [b"ok", b"10"]
    assert redis_client.hmget(keys.balance(uid), "balance", "v", "open", "dirty") == [b"30", b"10", b"1", None]
    assert lua.run("ledger_reconcile", keys=[keys.balance(uid)], args=["e1", -30, 9]) == [b"ok", b"11"]
    assert redis_client.hmget(keys.balance(uid), "balance", "open") == [b"0", b"BALANCE"]
    redis_client.hset(keys.balance(uid), "mode", "SYNC")
    assert lua.run("ledger_reconcile", keys=[keys.balance(uid)], args=["e1", 5, 9]) == [b"changed"]


def test_hash_update_never_creates_a_partial_hash(lua, redis_client, uid):
    assert lua.run("ledger_cache_update", keys=[keys.balance(uid)], args=["threshold", 5]) == 0
    assert not redis_client.exists(keys.balance(uid))
    _load(lua, uid, balance=100, version=5)
    assert lua.run("ledger_cache_update", keys=[keys.balance(uid)], args=["threshold", 5]) == 1
    assert redis_client.hmget(keys.balance(uid), "balance", "v", "threshold") == [b"100", b"5", b"5"]


def test_mode_to_sync_waits_for_pending_entries(lua, redis_client, uid):
    _load(lua, uid, balance=100)
    _apply(lua, uid, "D", 10, 1)
    assert lua.run(
        "ledger_to_sync", [keys.balance(uid), keys.pending(uid), keys.holds(uid), keys.hold_expiry(uid)], []
    ) == [b"pending", 1]
    redis_client.zrem(keys.pending(uid), "1")
    assert lua.run(
        "ledger_to_sync", [keys.balance(uid), keys.pending(uid), keys.holds(uid), keys.hold_expiry(uid)], []
    ) == [b"ok"]
    assert redis_client.hget(keys.balance(uid), "mode") == b"SYNC"


def test_lease_release_and_renew_only_by_owner(lua, redis_client, uid):
    key = f"{keys.IDGEN_WORKER_PREFIX}test-{uid}"
    redis_client.set(key, "me", px=1000)
    assert lua.run("ids_lease", keys=[key], args=["you", "release", 0]) == 0
    assert lua.run("ids_lease", keys=[key], args=["me", "renew", 60000]) == 1
    assert redis_client.pttl(key) > 1000
    assert lua.run("ids_lease", keys=[key], args=["me", "release", 0]) == 1
    assert not redis_client.exists(key)


def test_script_reloads_after_script_flush(lua, redis_client, uid):
    redis_client.script_flush()
    assert _apply(lua, uid, "D", 1, 1) == ["missing"]


def test_unknown_redis_error_is_not_swallowed(lua, uid):
    with pytest.raises(RedisCommandError):
        lua.run("ledger_apply", [keys.balance(uid)], ["D"])


# resend after settle (issue 10, item 5) ---------------------------------------------------------------------------
def _settle(lua, uid, *entry_ids, epoch="e1"):
    return lua.run(
        "ledger_settle",
        keys=[
            keys.pending(uid),
            keys.balance(uid),
            keys.held(uid),
            keys.holds(uid),
            *(keys.entry(uid, i) for i in entry_ids),
        ],
        args=[epoch],
    )


def test_a_call_resent_after_the_writer_settled_it_charges_once(lua, redis_client, uid):
    """The first call ran and its reply was lost; the writer persisted and settled the entry within
    milliseconds; redis-py's resend arrives after that. Before the fix: the settle had deleted the entry
    string, so the resend charged again (balance 9000 -> 8000) under the same id."""
    from hotledger.dal.redis_store import RETRY_HORIZON_S

    _load(lua, uid, balance=10_000)
    first = _apply(lua, uid, "D", 1000, 1)
    assert first == ["ok", "1", "9000", "6", "e1", "1", ""]
    assert _settle(lua, uid, 1) == [1, 0]
    assert _apply(lua, uid, "D", 1000, 1) == first
    assert redis_client.hmget(keys.balance(uid), "balance", "v") == [b"9000", b"6"]
    assert redis_client.zcard(keys.pending(uid)) == 0  # nothing pending: the settled entry is not counted again
    # the evidence outlives the client's longest resend many times over, then leaves
    assert RETRY_HORIZON_S * 5 < redis_client.ttl(keys.entry(uid, 1)) <= 3600
    assert _settle(lua, uid, 1) == [0, 0]  # a second settle (re-delivery) keeps the evidence as it is
    assert _apply(lua, uid, "D", 1000, 1) == first


def test_a_settled_entry_is_not_pending_for_the_readers(lua, redis_client, uid):
    """The evidence ledger_settle leaves is no pending entry: the order lookup, the pending list and the
    reconciler's reads see it as gone from Redis (in the DB)."""
    from hotledger.config import settings
    from hotledger.features import booking_reads, tell_booked
    from hotledger.ledger.store import LedgerStore, pending_entries

    _load(lua, uid, balance=10_000)
    _apply(lua, uid, "D", 1000, 1)
    _apply(lua, uid, "D", 1000, 2)
    _settle(lua, uid, 1)
    store = LedgerStore(lua, settings(), tell_booked, booking_reads)
    assert store.entry(uid, 1) is None and store.entry(uid, 2).amount == 1000
    assert [e.entry_id for e in pending_entries(redis_client, uid)] == [2]
    found, lost = store.entries(uid, [1, 2])
    assert [e.entry_id for e in found] == [2] and lost == []


def _voucher(lua, vid, stock=5, limit=2, epoch="ve1"):
    assert (
        lua.run(
            "voucher_load",
            [keys.voucher(vid), keys.voucher_buyers(vid), keys.voucher_away(vid)],
            [stock, 0, 2**41, limit, epoch, 0, 1, ""],
        )
        == 1
    )


def _order(lua, vid, user, order_id):
    reply = lua.run(
        "voucher_order",
        [
            keys.voucher(vid),
            keys.voucher_buyers(vid),
            keys.voucher_pending(vid),
            keys.voucher_stream(vid),
            keys.voucher_away(vid),
        ],
        [vid, user, order_id, 1_700_000_000_000, "", 0, 1],
    )
    return [x.decode() if isinstance(x, bytes) else str(x) for x in reply]


def _voucher_settle(lua, vid, *triples, version=2):
    return lua.run(
        "voucher_settle",
        [keys.voucher(vid), keys.voucher_buyers(vid), keys.voucher_pending(vid), keys.voucher_away(vid)],
        [version, *(x for t in triples for x in (*t, "own", 0))],
    )


def test_a_voucher_order_resent_after_the_writer_settled_it_takes_one_unit(lua, redis_client, uid):
    """Before the fix: voucher_settle had dropped the pending order, so the resend took a second unit
    (stock 4 -> 3) and a second slot of the buyer's limit under the same order id."""
    vid = uid
    _voucher(lua, vid, stock=5, limit=2)
    first = _order(lua, vid, 42, 7001)
    assert first == ["ok", "1", "ve1", "4", "0"]
    assert _voucher_settle(lua, vid, (7001, 42, "ve1")) == [1, 0]
    assert _order(lua, vid, 42, 7001) == first
    assert redis_client.hmget(keys.voucher(vid), "stock") == [b"4"]
    assert redis_client.hget(keys.voucher_buyers(vid), "42") == b"1"
    assert redis_client.hlen(keys.voucher_pending(vid)) == 0
    # the buyer's next order is a new one; both stay recognisable
    second = _order(lua, vid, 42, 7002)
    assert second == ["ok", "2", "ve1", "3", "0"]
    assert _voucher_settle(lua, vid, (7002, 42, "ve1")) == [1, 0]
    assert _voucher_settle(lua, vid, (7002, 42, "ve1")) == [0, 0]  # re-delivery: the evidence is kept once
    assert [_order(lua, vid, 42, i)[:3] for i in (7001, 7002)] == [first[:3], second[:3]]  # (stock: the current one)
    assert _order(lua, vid, 42, 7003) == ["already", "2"]
    assert redis_client.hget(keys.voucher(vid), "stock") == b"3"


# credits held until durable (issue 19, item 1) --------------------------------------------------------------------
def test_a_held_credit_is_posted_once_released_by_the_writers_settle_and_taken_back_by_a_rollback(
    lua, redis_client, uid
):
    _load(lua, uid, balance=0, epoch="e1")
    assert _apply(lua, uid, "R", 100, 1)[:3] == ["ok", "1", "100"]
    _apply(lua, uid, "R", 50, 2)
    _apply(lua, uid, "R", 30, 3)
    assert redis_client.hget(keys.balance(uid), "held") == b"180"
    assert _apply(lua, uid, "D", 1, 4)[0] == "insufficient"
    post = lambda entry_id: lua.run("ledger_post", [keys.balance(uid), keys.held(uid), keys.holds(uid)], [entry_id])  # noqa: E731
    assert (post(1), post(1)) == (1, 0)  # the broker acknowledged entry 1: posted once
    assert _settle(lua, uid, 1, 2) == [2, 0]  # entry 2's request died after its ack: the writer's settle posts it
    assert redis_client.hget(keys.balance(uid), "held") == b"30"
    assert _apply(lua, uid, "D", 150, 5)[0] == "ok" and _apply(lua, uid, "D", 1, 6)[0] == "insufficient"
    assert _rollback(lua, uid, 3)[0] == "rolled_back"  # entry 3's publish failed: taken back, never spent
    assert (
        redis_client.hget(keys.balance(uid), "held") is None and redis_client.hget(keys.balance(uid), "balance") == b"0"
    )
    assert post(3) == 0 and redis_client.hlen(keys.held(uid)) == 0


def test_a_new_load_drops_the_holds_of_a_lost_cache(lua, redis_client, uid):
    _load(lua, uid, balance=0, epoch="e1")
    _apply(lua, uid, "R", 100, 1)
    redis_client.delete(keys.balance(uid))  # the account hash lost (its held credits were in its balance)
    assert _load(lua, uid, balance=0, epoch="e2") == 1
    assert redis_client.hlen(keys.held(uid)) == 0 and redis_client.hget(keys.balance(uid), "held") is None
