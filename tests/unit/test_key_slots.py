"""Every script call touches one Redis Cluster slot: the keys (and pub/sub channels) each script is given for one
entity share one hash tag, with the Kafka transport and with the Redis Streams transport (where the entity's stream
shares it too); the global keys have a fixed home tag; the streams of the shards spread over the slot space."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from hotledger import config, keys

ENTITY_KEYS = {
    "account": lambda: [
        keys.balance(7),
        keys.entry(7, 11),
        keys.pending(7),
        keys.fate(7, 11),
        keys.idempotency(7, "k"),
        keys.account_stream(7),
    ],
    "voucher": lambda: [
        keys.voucher(3),
        keys.voucher_buyers(3),
        keys.voucher_pending(3),
        keys.voucher_fate(3, 5),
        keys.voucher_stream(3),
    ],
    "red packet": lambda: [
        keys.packet(9),
        keys.packet_unclaimed(9),
        keys.packet_grabbers(9),
        keys.packet_pending(9),
        keys.packet_fate(9, 2),
        keys.packet_stream(9),
    ],
    "inbox": lambda: [keys.inbox_index(4), keys.inbox_message(4, "m"), keys.inbox_biz(4, "pay", "o-1")],
    "delay queue": lambda: [*keys.delay_offer_keys("q"), keys.delay_receipts("q"), keys.delay_seq("q")],
    "lock": lambda: [
        keys.lock("account-7"),
        keys.lock_fence("account-7"),
        keys.lock_channel("account-7"),
        keys.lock_waiters("account-7"),
    ],
    "worker-id leases": lambda: [keys.IDGEN_WORKER_PREFIX + "next", keys.IDGEN_WORKER_PREFIX + "5"],
}


@pytest.fixture(params=["kafka", "redis-stream"])
def transport(request, monkeypatch):
    monkeypatch.setenv("EVENT_TRANSPORT", request.param)
    monkeypatch.setenv("STREAM_SHARDS", "16")
    config.settings.cache_clear()
    yield request.param
    monkeypatch.undo()
    config.settings.cache_clear()


@pytest.mark.parametrize("entity", ENTITY_KEYS)
def test_the_keys_of_one_entity_share_one_hash_tag(entity, transport):
    names = ENTITY_KEYS[entity]()
    if transport == "kafka":
        names = [n for n in names if not n.startswith("events:unused:")]  # passed, never touched
    assert all("{" in name and "}" in name for name in names), names
    assert len({key_slot(name.encode()) for name in names}) == 1, names


def test_the_shards_streams_spread_over_the_slots_of_three_masters():
    """`redis-cli --cluster create` gives three masters a third of the slots each: 16 shards reach all three."""
    thirds = {key_slot(keys.stream(shard).encode()) * 3 // 16384 for shard in range(16)}
    assert thirds == {0, 1, 2}


def test_an_accounts_keys_are_its_keys_as_each_is_built_under_the_settings_of_the_moment(transport, monkeypatch):
    from hotledger.keys import AccountKeys

    def built(user_id: int) -> AccountKeys:
        names = {
            field: getattr(keys, "account_stream" if field == "stream" else field) for field in AccountKeys._fields
        }
        return AccountKeys(**{field: name(user_id) for field, name in names.items()})

    assert keys.account_keys(7) == built(7) and keys.account_keys(8) == built(8)
    assert keys.account_keys(7) is keys.account_keys(7)  # built once
    before = keys.account_keys(7)
    monkeypatch.setenv("EVENT_TRANSPORT", "kafka" if transport == "redis-stream" else "redis-stream")
    config.settings.cache_clear()  # as tests changing a setting do (runtime.reset)
    assert keys.account_keys(7) == built(7) != before


def test_no_more_accounts_keys_are_kept_than_the_bound(monkeypatch):
    monkeypatch.setattr(keys, "ACCOUNT_KEYS_KEPT", 3)
    for user_id in range(1, 8):
        assert keys.account_keys(user_id).balance == keys.balance(user_id)
        assert len(keys._account_keys[1]) <= 3
