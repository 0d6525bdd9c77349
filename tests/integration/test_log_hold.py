"""The log hold of a rebuilt entity (outbox/log_hold.py) on the real broker: it lifts only once the writer's
watermark is past every record the log held at the rebuild, records of multi-record batches included (Tansu
answers ListOffsets(latest) with its last batch's base offset + 1)."""

from confluent_kafka import Producer

from hotledger import runtime
from hotledger.outbox.log_hold import AWAITING

HOLD_KEY = "v:{log-hold-test}"


def test_a_rebuild_hold_lifts_only_once_the_writer_applied_every_record_of_a_batch(own_topic, settings, redis_client):
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 500, "acks": "all"})
    for _ in range(5):  # one batch: offsets 0-4 of partition 0
        producer.produce(own_topic, partition=0, value=b"{}")
    assert producer.flush(10) == 0
    redis_client.hset(HOLD_KEY, "hold_log", AWAITING)  # as a rebuild leaves it
    hold, outbox = runtime.log_hold(), runtime.outbox()

    outbox.record_applied({(own_topic, 0): 0})  # the writer applied the batch's first record only
    assert not hold.passed(HOLD_KEY)
    outbox.record_applied({(own_topic, 0): 3})
    assert not hold.passed(HOLD_KEY)
    outbox.record_applied({(own_topic, 0): 4})  # the whole batch
    assert hold.passed(HOLD_KEY)
    assert outbox.log_hold(HOLD_KEY) == ""  # lifted


def test_a_hold_waits_while_a_dead_letter_of_the_trigger_is_unresolved(own_topic, settings, redis_client):
    """Issue 19 item 8: a batch the writer function kept failing on goes, past the trigger's retries, to
    `<topic>.dead-letter`, and the batches after it moved the watermark past it: a rebuilt voucher or packet could sell
    before an acknowledged order or claim in that batch was applied. The entity stays RECOVERING while an unresolved
    dead letter exists; an operator who replayed it resolves it."""
    from hotledger.outbox.log_hold import dead_letter_topic

    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "acks": "all"})
    for _ in range(3):  # offsets 0-2; the batch 0-1 failed the writer and was given up by the trigger
        producer.produce(own_topic, partition=0, value=b"{}")
    producer.produce(dead_letter_topic(own_topic), value=b"{}", key=b"v1")  # where the trigger sent it
    assert producer.flush(10) == 0
    redis_client.hset(HOLD_KEY, "hold_log", AWAITING)  # a rebuild after all that
    hold, outbox = runtime.log_hold(), runtime.outbox()
    outbox.record_applied({(own_topic, 0): 2})  # the batch after it was applied: the watermark is past the dead letter
    assert not hold.passed(HOLD_KEY)  # the entity stays RECOVERING
    assert sum(hold.resolve_dead_letters().values()) == 1  # an operator replayed it (new offsets of the topic)
    assert hold.passed(HOLD_KEY)
    assert outbox.log_hold(HOLD_KEY) == ""
