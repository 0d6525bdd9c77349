"""The writer function driven with MSK events, against real Redis and DB."""

import json
from datetime import datetime, timedelta

from helpers import EVENTS, invoke_writer, ledger_records, signed_value
from hotledger import keys
from hotledger.dal.event_keys import EventKeys
from hotledger.ledger.feature import ledger
from hotledger.ledger.replies import RollbackStatus


def _pending_records(redis_client, user_id, first_offset=0):
    """The events the API published for this account, rebuilt from Redis as the broker would hold them."""
    return ledger_records(redis_client, [user_id], first_offset)


def test_batch_is_persisted_once_and_replays_change_nothing(api, redis_client, sql):
    user_id = api.account(balance="100.00")
    for amount in ("1.00", "2.00", "3.00"):
        assert api("POST", f"/accounts/{user_id}/deduct", {"amount": amount})[0] == 200
    records = _pending_records(redis_client, user_id)
    assert len(records) == 4  # one recharge, three deducts
    invoke_writer(records)
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((9400,),)
    assert sql("SELECT COUNT(*), SUM(amount) FROM t_order WHERE user_id = %s", (user_id,)) == ((3, 600),)
    assert sql("SELECT COUNT(*) FROM t_pay WHERE user_id = %s", (user_id,)) == ((1,),)
    assert redis_client.zcard(keys.pending(user_id)) == 0
    stamps = {json.loads(value)["id"]: json.loads(value)["ts"] for *_, value in records}
    for entry_id, created in sql("SELECT id, create_time FROM t_order WHERE user_id = %s", (user_id,)):
        # the charge's time, in UTC, to the millisecond
        assert created == datetime(1970, 1, 1) + timedelta(milliseconds=stamps[entry_id])
    invoke_writer(records + records)  # re-delivery, twice over, in one batch
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((9400,),)
    assert sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((3,),)


def test_out_of_order_batches_never_move_the_balance_backwards(api, redis_client, sql):
    user_id = api.account(balance="10.00")
    for _ in range(4):
        api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    records = _pending_records(redis_client, user_id)
    newest_first = list(reversed(records))
    invoke_writer(newest_first[:2])
    version_after_newest = sql("SELECT version FROM t_account WHERE user_id = %s", (user_id,))[0][0]
    invoke_writer(newest_first[2:])
    balance, version = sql("SELECT balance, version FROM t_account WHERE user_id = %s", (user_id,))[0]
    assert balance == 600 and version == version_after_newest
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "6.00"


def test_poison_records_are_dead_lettered_not_retried(api, redis_client, sql, settings):
    user_id = api.account(balance="10.00")
    api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    good = _pending_records(redis_client, user_id, first_offset=100)
    poison = [
        (1, 7, b"x", b"not json"),
        (1, 8, b"y", json.dumps({"type": "ledger", "id": "NaN"}).encode()),
        (1, 9, None, None),
        (
            1,
            10,
            b"999999",
            signed_value(
                {
                    "type": "ledger",
                    "id": 5,
                    "kind": "D",
                    "user_id": 999999,
                    "amount": 1,
                    "balance_after": 0,
                    "version": 2,
                    "epoch": "e",
                    "ts": 1,
                    "open": "1",
                    "idem_key": None,
                }
            ),
        ),
    ]
    response = invoke_writer(poison + good)
    assert response == {"batchItemFailures": []}
    assert sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((1,),)
    # this test's dead letters: the poison of partition 1, and the entry (id 5) of the unknown account 999999; another
    # test of the run may dead-letter an entry with id 5 of its own
    dead = sql(
        "SELECT topic, partition_no, offset_no FROM t_dead_letter WHERE (topic = %s AND partition_no = 1)"
        " OR (offset_no = 5 AND record_key = '999999') ORDER BY offset_no",
        (settings.kafka_topic,),
    )
    assert [row[2] for row in dead] == [5, 7, 8, 9]
    invoke_writer(poison)  # the same poison again: still one dead letter each
    assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE topic = %s AND partition_no = 1", (settings.kafka_topic,)) == (
        (3,),
    )


def test_a_rolled_back_entry_is_never_persisted(api, redis_client, sql):
    """The publish timed out but the event reached the broker: the API rolled back, the writer must skip it. The
    API's rollback as LedgerService._undo makes it: recorded in the DB (not persisted yet), then given back in Redis."""
    user_id = api.account(balance="10.00")
    api("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"})
    records = _pending_records(redis_client, user_id)
    deduct_id = json.loads(records[-1][3])["id"]
    assert ledger().store.record_rollback(user_id, deduct_id, "D") is False  # not persisted: rolled back for good
    assert ledger().store.rollback(user_id, deduct_id, None).status is RollbackStatus.ROLLED_BACK
    invoke_writer(records)
    assert sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((0,),)
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1000,),)
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "10.00"


def test_sample_msk_event_file(api, sql, monkeypatch):
    """The sample event (one deduct of account 1) is persisted exactly once: its row, the balance moved once, no
    dead letter; a re-delivery changes nothing."""
    event = json.loads((EVENTS / "writer_msk.json").read_text())
    (value,) = [json.loads(__import__("base64").b64decode(r["value"])) for rs in event["records"].values() for r in rs]
    assert (value["user_id"], value["kind"]) == (1, "D")
    api.account()  # a fresh schema numbers its first account 1
    sample_keys = EventKeys(None, (EVENTS / "sample-event-keys.json").read_text(), 0)  # what env.json gives sam local
    monkeypatch.setattr("writer.app.event_keys", lambda: sample_keys)
    (balance_before,) = sql("SELECT balance FROM t_account WHERE user_id = 1")[0]
    from writer.app import handler

    from infra.localrt.events import LambdaContext

    for _ in range(2):
        assert handler(event, LambdaContext("WriterFunction")) == {"batchItemFailures": []}
        assert sql("SELECT user_id, amount, balance FROM t_order WHERE id = %s", (value["id"],)) == (
            (1, value["amount"], value["balance_after"]),
        )
        assert sql("SELECT COUNT(*) FROM t_dead_letter WHERE offset_no = %s", (value["id"],)) == ((0,),)
        assert sql("SELECT balance FROM t_account WHERE user_id = 1") == ((balance_before - value["amount"],),)


def test_an_id_clash_is_dead_lettered_not_dropped(api, redis_client, sql):
    user_id = api.account(balance="10.00")
    api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})
    records = _pending_records(redis_client, user_id)
    invoke_writer(records)
    original = json.loads(records[-1][3])
    clash = {**original, "amount": 999, "version": original["version"] + 50}
    invoke_writer([(2, 1, b"k", signed_value(clash))])
    assert sql("SELECT amount FROM t_order WHERE id = %s", (original["id"],)) == ((100,),)
    assert sql("SELECT error FROM t_dead_letter WHERE offset_no = %s", (original["id"],)) == (
        ("entry id already used by another entry",),
    )
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((900,),)


def test_partition_writers_side_by_side_never_deadlock_on_idempotency_keys(api, redis_client, sql):
    """Partitions' writers (the writer handler in threads, each its own DB connection) persist keyed charges of
    their own accounts at the same time, round after round. The accounts interleave in id order, so each batch's keys
    sit between the other's in t_idempotency's primary key: a writer that locked the gaps around its keys (SELECT ...
    FOR UPDATE of keys not there yet) and then inserted them deadlocked with the other (MySQL 1213), and its batch
    was retried. The account row locks already order every write of an account's keys."""
    import threading

    from hotledger.dal import db

    writers, per_writer = 4, 8
    accounts = {p: [] for p in range(writers)}
    for i in range(writers * per_writer):  # created in turn: the writers' accounts interleave in id order
        accounts[i % writers].append(api.account(balance="100.00"))
    everyone = [u for p in accounts for u in accounts[p]]
    invoke_writer(ledger_records(redis_client, everyone))  # the funding recharges
    failures, rounds = [], 6
    for round_no in range(rounds):
        for user_id in everyone:
            for n in range(3):
                headers = {"Idempotency-Key": f"r{round_no}-{n}"}
                assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"}, headers=headers)[0] == 200
        batches = {p: ledger_records(redis_client, accounts[p], first_offset=1_000 * round_no) for p in accounts}
        start = threading.Barrier(writers)

        def write(partition: int, start=start, batches=batches) -> None:  # this round's, bound now
            start.wait()
            try:
                invoke_writer([(partition, offset, key, value) for _, offset, key, value in batches[partition]])
            except db.DatabaseUnavailable as exc:
                failures.append(str(exc))

        threads = [threading.Thread(target=write, args=(p,)) for p in accounts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []
    assert sql("SELECT COUNT(*) FROM t_idempotency WHERE user_id IN ({})".format(",".join(map(str, everyone)))) == (
        (writers * per_writer * 3 * rounds,),
    )


def test_a_batch_of_open_and_closed_accounts_lands_each_flag(api, redis_client, sql):
    # the flags go in one UPDATE per distinct flag (ledger/tx.py move_accounts): each account gets its own
    closing, staying = api.account(balance="5.00"), api.account(balance="5.00")
    assert api("PATCH", f"/accounts/{closing}", {"api_open": False})[0] == 200
    assert api("POST", f"/accounts/{closing}/recharge", {"amount": "1.00"})[0] == 200  # its event: closed
    assert api("POST", f"/accounts/{staying}/deduct", {"amount": "1.00"})[0] == 200  # its event: open
    reason = sql("SELECT close_reason FROM t_user WHERE id = %s", (closing,))[0][0]
    assert reason is not None
    # the DB as if it had neither flag yet: the writer lands them
    sql("UPDATE t_user SET api_open = 1, close_reason = NULL WHERE id = %s", (closing,))
    sql("UPDATE t_user SET api_open = 0, close_reason = 'stale' WHERE id = %s", (staying,))
    invoke_writer(ledger_records(redis_client, [closing, staying]))
    flags = {
        row[0]: row[1:]
        for row in sql("SELECT id, api_open, close_reason FROM t_user WHERE id IN (%s, %s)", (closing, staying))
    }
    assert flags == {closing: (0, reason), staying: (1, None)}
