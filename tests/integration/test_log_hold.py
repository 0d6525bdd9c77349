"""The log hold of a rebuilt entity (outbox/log_hold.py) on the real broker: it lifts only once the writer's
watermark is past every record the log held at the rebuild, records of multi-record batches included (Tansu
answers ListOffsets(latest) with its last batch's base offset + 1)."""

import time

from confluent_kafka import Producer

from hotledger import runtime
from hotledger.outbox.log_hold import AWAITING, LogHold

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


def test_rebuilt_accounts_share_a_read_of_the_logs_end_made_after_their_time_holds(own_topic, settings, redis_client):
    """After a Redis loss every account touched is rebuilt and held: each first check would read the whole topic's
    ends (a consumer, ListOffsets and a fetch per partition). A read this process started after an account's time hold
    ended is as good as its own; an older one is not: records acknowledged after it would be missed."""
    from hotledger.dal import publisher

    reads = []

    def end_offsets(topic):
        reads.append(topic)
        return publisher.end_offsets(topic)

    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "acks": "all"})
    producer.produce(own_topic, partition=0, value=b"{}")  # offset 0
    assert producer.flush(10) == 0
    hold, outbox = LogHold(runtime.outbox(), end_offsets, own_topic, streamed=False), runtime.outbox()
    keys_ = [f"user:balance:{{log-hold-{n}}}" for n in range(3)]
    for key in keys_:
        redis_client.hset(key, "hold_log", AWAITING)
    over_at = int(time.time() * 1000)
    assert not hold.passed(keys_[0], over_at) and not hold.passed(keys_[1], over_at)
    assert len(reads) == 1  # the second account took the first one's read
    producer.produce(own_topic, partition=0, value=b"{}")  # offset 1, acknowledged after that read
    assert producer.flush(10) == 0
    assert not hold.passed(keys_[2], int(time.time() * 1000) + 1)  # its time hold ended after the read: its own
    assert len(reads) == 2
    outbox.record_applied({(own_topic, 0): 0})
    assert hold.passed(keys_[0]) and hold.passed(keys_[1])  # their ends: offset 0
    assert not hold.passed(keys_[2])  # offset 1 is not applied yet
    outbox.record_applied({(own_topic, 0): 1})
    assert hold.passed(keys_[2])
