"""The writer's side: records as the broker holds them (rebuilt from Redis, signed as the service signs), the writer
handler invoked with them, and a rebuilt entity's hold lifted."""

from __future__ import annotations

import os
import time
import uuid

from infra.localrt import events


def invoke_writer(records: list[tuple[int, int, bytes | None, bytes | None]], topic: str | None = None) -> dict:
    """The writer function with an MSK event holding these (partition, offset, key, value) records."""
    from writer.app import handler

    topic = topic or os.environ["KAFKA_TOPIC"]
    event = events.msk(topic, [(p, o, k, v, 1_700_000_000_000) for p, o, k, v in records])
    return handler(event, events.LambdaContext("WriterFunction"))


def broker_records(topic: str | None = None) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record the broker's log holds for the topic, with its real partition and offset, in log order per
    partition: what an MSK event source delivers to the writer."""
    from confluent_kafka import Consumer, TopicPartition

    topic = topic or os.environ["KAFKA_TOPIC"]
    reader = Consumer(
        {
            "bootstrap.servers": os.environ["KAFKA_BOOTSTRAP"],
            "group.id": f"test-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        ends = {
            p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in reader.list_topics(topic, timeout=10).topics[topic].partitions
        }
        reader.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        found = []
        deadline = time.monotonic() + 30
        while len(found) < sum(ends.values()) and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is not None and message.error() is None:
                found.append((message.partition(), message.offset(), message.key(), message.value()))
        return sorted(found)
    finally:
        reader.close()


def lift_rebuild_hold(redis_client, hash_key: str, log_too: bool = True) -> None:
    """A rebuilt voucher or red packet as REBUILD_HOLD_S after its rebuild: the time hold over (log_too: and its
    log hold lifted, as if the writer had caught up)."""
    assert redis_client.exists(hash_key), f"{hash_key} is not rebuilt: a hold set on no hash would make one up"
    redis_client.hset(hash_key, "hold_until", 0)
    if log_too:
        redis_client.hdel(hash_key, "hold_log")


def rebuilt_after_the_writer_caught_up(redis_client, user_id: int) -> None:
    """The account Redis lost is rebuilt, and its hold over new keys and its holds' changes lifted, as it is once the
    writer applied the log as it was at the loss (the tests' writer is fed by hand: no watermark to read)."""
    from hotledger import keys
    from hotledger.ledger import feature as ledger_feature

    ledger_feature.ledger().load_cache(user_id)
    lift_rebuild_hold(redis_client, keys.balance(user_id))


def records(events_, key_of, partition: int = 0, first_offset: int = 0) -> list[tuple[int, int, bytes, bytes]]:
    """Events as the broker holds them, signed as the service signs them: (partition, offset, key, JSON value)."""
    return [
        (partition, first_offset + i, key_of(e).encode(), signed_value(e.model_dump())) for i, e in enumerate(events_)
    ]


def run_event_keys():
    """The run's keyring (EVENT_KEYS, set by conftest), as the functions read it."""
    from hotledger.dal.event_keys import EventKeys

    return EventKeys(None, os.environ["EVENT_KEYS"], 0)


def verified_fields(event: dict) -> dict:
    """A published event's fields, once its signature passed the writer's check (decode)."""
    from hotledger.dal.event_keys import record_value
    from hotledger.outbox.events import RawRecord, decode

    events_, poison = decode([RawRecord("t", 0, 0, None, record_value(event))], run_event_keys())
    assert not poison, poison
    return events_[0].model_dump(exclude_unset=True)


def signed_value(event: dict) -> bytes:
    """An event's record value as the service publishes it: signed with the run's current key (a `kid` and `mac` it
    carries, say from a record changed for a test, are replaced)."""
    from hotledger.dal.event_keys import record_value
    from hotledger.outbox.events import EVENT_ADAPTER, signed

    return record_value(signed(EVENT_ADAPTER.validate_python(event).model_dump(), run_event_keys().keyring()))


def ledger_records(redis_client, user_ids, first_offset: int = 0):
    """The ledger events the API published for these accounts, rebuilt from Redis (per account in version order)."""
    from hotledger.ledger.store import pending_entries

    entries = sorted(
        (e for u in user_ids for e in pending_entries(redis_client, u)), key=lambda e: (e.user_id, e.version)
    )
    return records([e.to_event() for e in entries], lambda e: str(e.user_id), first_offset=first_offset)
