"""Issue 21, the operators' console routes (hotledger/ops): dead letters of every source listed and replayed, each
replay idempotent and logged with its operator; an account as the DB and Redis hold it; the reconciler parts' last
runs. Through the API handler, the writer handler, the real broker, Redis and DB; admin scope only."""

import json

import pytest
from confluent_kafka import Producer
from standardwebhooks import Webhook

from helpers import Api, broker_records, invoke_writer, ledger_records, reconcile
from hotledger import runtime
from hotledger.dal.event_keys import EventKeys
from hotledger.dal.topics import dead_letter_topic
from hotledger.webhooks import feature as webhooks_feature
from infra.event_keys import new_keyring

OPERATOR = Api(scopes=("admin",))


def _balance(sql, user_id: int) -> int:
    return sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,))[0][0]


def _replay(source: str, ids=None) -> dict:
    status, body = OPERATOR("POST", "/ops/dead-letters/replay", {"source": source, **({"ids": ids} if ids else {})})
    assert status == 200, body
    return body


def _writer_dead_letters() -> dict:
    status, body = OPERATOR("GET", "/ops/dead-letters?source=writer&limit=500")
    assert status == 200 and set(body) == {"writer"}, body
    return {d["id"]: d for d in body["writer"]}


@pytest.fixture
def stale_writer_keyring(monkeypatch):
    """The writer's keyring lags the API's (a rotation the writer has not read yet): it holds another key only."""
    stale = EventKeys(None, json.dumps(new_keyring()), 0)
    monkeypatch.setattr("writer.app.event_keys", lambda: stale)
    return monkeypatch


def test_a_record_the_writer_could_not_verify_is_replayed_once_and_applied_once(
    own_topic, api, sql, redis_client, stale_writer_keyring
):
    user_id = api.account(balance="10.00")
    (record,) = ledger_records(redis_client, [user_id])
    assert invoke_writer([record]) == {"batchItemFailures": []}  # stale: set aside
    assert _balance(sql, user_id) == 0
    set_aside = [d for d in _writer_dead_letters().values() if d["key"] == str(user_id)]
    assert len(set_aside) == 1 and "signed with key" in set_aside[0]["error"] and not set_aside[0]["final"]

    stale_writer_keyring.undo()  # the writer read the rotated keyring
    dead_id = set_aside[0]["id"]
    assert _replay("writer", [dead_id]) == {"replayed": [dead_id], "skipped": {}}
    assert _replay("writer", [dead_id])["skipped"][dead_id].startswith("replayed already")  # idempotent
    published, replayed = [r for r in broker_records(own_topic) if r[2] == str(user_id).encode()]
    assert replayed[3] == record[3]  # after the API's publish, the replay, once: the bytes the writer set aside
    assert invoke_writer([replayed], own_topic) == {"batchItemFailures": []}
    assert invoke_writer([published, replayed], own_topic) == {"batchItemFailures": []}  # again: applied once
    assert _balance(sql, user_id) == 1000
    assert sql("SELECT COUNT(*) FROM t_entry WHERE user_id = %s", (user_id,)) == ((1,),)
    assert _writer_dead_letters()[dead_id]["replayed_at"] is not None

    again, first = [
        entry
        for entry in OPERATOR("GET", "/ops/log?limit=50")[1]
        if entry["action"] == "replay.writer" and entry["detail"]["ids"] == [dead_id]
    ][:2]  # newest first: both replays are logged, who made them and what came of each
    assert first["actor"] and first["detail"]["replayed"] == [dead_id]
    assert again["detail"]["replayed"] == [] and dead_id in again["detail"]["skipped"]


def test_a_replayed_forgery_is_set_aside_again_and_changes_nothing(own_topic, api, sql, redis_client):
    user_id = api.account(balance="10.00")
    assert invoke_writer(ledger_records(redis_client, [user_id])) == {"batchItemFailures": []}
    forged = json.dumps(
        {
            "type": "ledger",
            "id": 1,
            "kind": "R",
            "user_id": user_id,
            "amount": 10**8,
            "balance_after": 10**8 + 1000,
            "version": 99,
            "epoch": "x",
            "ts": 1,
            "open": "1",
        }
    ).encode()
    assert invoke_writer([(0, 10**12, str(user_id).encode(), forged)], own_topic) == {"batchItemFailures": []}
    (dead_id,) = [i for i, d in _writer_dead_letters().items() if d["offset"] == 10**12 and d["topic"] == own_topic]
    assert _replay("writer", [dead_id])["replayed"] == [dead_id]  # sent back as it was: no new signature
    again = [r for r in broker_records(own_topic) if r[3] == forged]
    assert invoke_writer(again, own_topic) == {"batchItemFailures": []}
    assert _balance(sql, user_id) == 1000
    assert any("forged" in d["error"] and d["offset"] == again[0][1] for d in _writer_dead_letters().values())


def test_a_change_the_db_refused_is_final_and_never_replayed(own_topic, api, sql, redis_client):
    """A persister's refusal was settled as refused (given back in Redis, the user told it failed): final."""
    user_id = api.account(balance="10.00")
    (record,) = ledger_records(redis_client, [user_id])
    event = json.loads(record[3])
    event["amount"] = event["balance_after"] = 10**19  # more than the DB's column holds
    from helpers import signed_value

    assert invoke_writer([(0, record[1], record[2], signed_value(event))], own_topic) == {"batchItemFailures": []}
    final = [d for d in _writer_dead_letters().values() if d["final"] and d["key"] == str(user_id)]
    assert final and "Out of range" in final[0]["error"]
    on_topic = broker_records(own_topic)  # the API's publish
    outcome = _replay("writer", [final[0]["id"]])
    assert outcome["replayed"] == [] and outcome["skipped"][final[0]["id"]].startswith("final")
    assert broker_records(own_topic) == on_topic


def test_the_dead_letter_topic_is_replayed_in_order_once_and_resolved(own_topic, api, sql, redis_client, settings):
    user_id = api.account(balance="10.00")
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "3.00"})[0] == 200
    records = ledger_records(redis_client, [user_id])
    # the writer's trigger gave the batch up: it sent the records, whole, to the dead-letter topic (template.yaml)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "acks": "all"})
    for partition, offset, key, value in records:
        producer.produce(
            dead_letter_topic(own_topic),
            key=key,
            value=value,
            headers=[
                ("source-topic", own_topic.encode()),
                ("source-partition", str(partition).encode()),
                ("source-offset", str(offset).encode()),
                ("failure-reason", b"MaximumRetryAttempts (10) exhausted"),
            ],
        )
    assert producer.flush(10) == 0
    assert runtime.log_hold().unresolved_dead_letters()  # rebuilt vouchers and packets wait

    listed = OPERATOR("GET", "/ops/dead-letters?source=topic")[1]["topic"]
    assert [r["source_offset"] for r in listed] == [str(o) for _, o, _, _ in records]
    assert "MaximumRetryAttempts" in listed[0]["reason"]
    assert len(_replay("topic")["replayed"]) == 2
    assert _replay("topic")["replayed"] == []  # resolved: nothing left
    assert not runtime.log_hold().unresolved_dead_letters()
    assert OPERATOR("GET", "/ops/dead-letters?source=topic")[1]["topic"] == []

    replayed = broker_records(own_topic)[-2:]  # after the API's own publishes
    assert [r[3] for r in replayed] == [v for _, _, _, v in records]  # in their order, the bytes as they were
    assert invoke_writer(replayed, own_topic) == {"batchItemFailures": []}
    assert _balance(sql, user_id) == 700
    status, body = OPERATOR("POST", "/ops/dead-letters/replay", {"source": "topic", "ids": ["0:1"]})
    assert status == 422 and body["error"]["code"] == "INVALID_DEAD_LETTER_ID"


def test_an_account_as_the_db_and_redis_hold_it(api, sql, redis_client):
    user_id = api.account(balance="10.00")
    assert invoke_writer(ledger_records(redis_client, [user_id])) == {"batchItemFailures": []}
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.50"})[0] == 200
    status, view = OPERATOR("GET", f"/ops/accounts/{user_id}")
    assert status == 200, view
    assert view["db"]["balance"] == 1000 and view["redis"]["balance"] == 750
    assert [(e["kind"], e["delta"]) for e in view["pending"]] == [("D", -250)]
    assert view["expected_balance"] == 750 and view["agrees"]

    redis_client.hset(f"user:balance:{{{user_id}}}", "balance", 999)  # a cache gone wrong
    assert not OPERATOR("GET", f"/ops/accounts/{user_id}")[1]["agrees"]

    sync_id = api.account(balance="10.00", deduct_type="SYNC")
    assert api("POST", f"/accounts/{sync_id}/deduct", {"amount": "2.50"})[0] == 200
    view = OPERATOR("GET", f"/ops/accounts/{sync_id}")[1]
    assert view["db"]["balance"] == 750 and view["redis"] == {"mode": "SYNC"} and view["agrees"]  # the mode alone
    assert OPERATOR("GET", "/ops/accounts/2147483000")[1]["error"]["code"] == "ACCOUNT_NOT_FOUND"


def test_each_reconciler_part_shows_its_cursor_and_last_run(api):
    reconcile()
    status, parts = OPERATOR("GET", "/ops/reconciler")
    assert status == 200, parts
    names = [p["part"] for p in parts]
    assert {"accounts", "vouchers", "packets", "keys", "holds"} <= set(names)
    for part in parts:
        assert part["last_run"] is not None and part["last_run"]["failed"] is False, part
        assert isinstance(part["last_run"]["findings"], dict)


def test_a_dead_lettered_webhook_is_sent_again_once_and_its_endpoint_unflagged(api, local_hooks, monkeypatch):
    hooks = webhooks_feature.webhooks()
    receiver = local_hooks(500)
    status, endpoint = api("POST", "/webhook-endpoints", {"url": receiver.url, "event_types": ["charge.persisted"]})
    assert status == 201, endpoint
    endpoint_id = endpoint["endpoint_id"]
    user_id = api.account(balance="10.00", deduct_type="SYNC")  # booked at once
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
    hooks.send_due()
    clock = hooks.clock
    with monkeypatch.context() as later:
        later.setattr(hooks, "clock", lambda: clock() + 4 * 86_400_000)  # past the 3 days of retries: dead-lettered
        hooks.send_due()
    dead = [
        d for d in OPERATOR("GET", "/ops/dead-letters?source=webhook")[1]["webhook"] if d["endpoint_id"] == endpoint_id
    ]
    assert [d["seq"] for d in dead] == [2] and dead[0]["last_status"] == 500
    assert api("GET", f"/webhook-endpoints/{endpoint_id}")[1]["failing"] is True

    receiver.status = 204
    assert _replay("webhook", [endpoint_id])["replayed"] == [f"{endpoint_id}: 1 deliveries"]
    assert _replay("webhook", [endpoint_id])["skipped"] == {endpoint_id: "no dead-lettered deliveries"}  # once
    assert api("GET", f"/webhook-endpoints/{endpoint_id}")[1]["failing"] is False
    hooks.send_due()
    headers, body = receiver.got[-1]  # the earlier attempts were signed at the moved clock's time
    assert Webhook(endpoint["secret"]).verify(body, headers)["data"]["seq"] == 2
    status, delivered = api("GET", f"/webhook-endpoints/{endpoint_id}/deliveries?state=DELIVERED")
    assert [d["seq"] for d in delivered] == [2]


@pytest.mark.parametrize("caller", [Api(scopes=("service",)), Api(user_id=1, scopes=())])
def test_only_operators_use_the_console(caller):
    for method, path, body in (
        ("GET", "/ops/dead-letters", None),
        ("GET", "/ops/reconciler", None),
        ("GET", "/ops/accounts/1", None),
        ("GET", "/ops/log", None),
        ("POST", "/ops/dead-letters/replay", {"source": "writer"}),
    ):
        status, answer = caller(method, path, body)
        assert (status, answer["error"]["code"]) == (403, "FORBIDDEN"), (path, answer)


@pytest.mark.parametrize(
    "body",
    [
        {"source": "everything"},
        {"source": "writer", "ids": ["abc"]},
        {"source": "stream", "ids": ["1-2"]},
        {"source": "writer", "extra": 1},
    ],
)
def test_a_bad_replay_request_is_a_422_and_changes_nothing(body):
    status, answer = OPERATOR("POST", "/ops/dead-letters/replay", body)
    assert status == 422 and answer["error"]["code"] in ("VALIDATION_ERROR", "INVALID_DEAD_LETTER_ID"), answer


def test_a_dead_letter_older_than_its_rollback_record_is_refused(
    own_topic, api, sql, redis_client, settings, stale_writer_keyring
):
    """Issue 32 item 13: t_rolled_back is pruned after KEY_RETENTION_DAYS; a writer dead letter past what its rollback
    record can still judge is refused (409 DEAD_LETTER_EXPIRED), named or not, and nothing goes back to the topic."""
    user_id = api.account(balance="10.00")
    (record,) = ledger_records(redis_client, [user_id])
    assert invoke_writer([record]) == {"batchItemFailures": []}  # stale keyring: set aside
    (dead_id,) = [i for i, d in _writer_dead_letters().items() if d["key"] == str(user_id)]
    assert _writer_dead_letters()[dead_id]["expired"] is False
    stale_writer_keyring.undo()
    # set aside long ago: the record was produced up to the log's retention before, its rollback record may be gone
    days = settings.key_retention_days - 7
    sql("UPDATE t_dead_letter SET create_time = create_time - INTERVAL %s DAY WHERE id = %s", (days, int(dead_id)))
    on_topic = broker_records(own_topic)
    status, answer = OPERATOR("POST", "/ops/dead-letters/replay", {"source": "writer", "ids": [dead_id]})
    assert (status, answer["error"]["code"]) == (409, "DEAD_LETTER_EXPIRED"), answer
    everything = _replay("writer")
    assert dead_id not in everything["replayed"] and everything["skipped"][dead_id].startswith("DEAD_LETTER_EXPIRED")
    assert broker_records(own_topic) == on_topic
    assert _writer_dead_letters()[dead_id]["expired"] is True
    assert _balance(sql, user_id) == 0
