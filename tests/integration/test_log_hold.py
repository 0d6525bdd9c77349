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
