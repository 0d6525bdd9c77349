"""Both Kafka clients behind hotledger.dal.publisher against a real broker: acknowledged events are on
the topic, keyed by user; a dead broker fails within the publish timeout; a restarted one is used again."""

import json
import time

import pytest
from kafka import KafkaConsumer

from hotledger.config import settings
from hotledger.dal import publisher
from infra import services


@pytest.fixture(params=["confluent", "kafka-python"])
def client(request, monkeypatch, tmp_path):
    broker = services.TansuBroker(services.free_port(), tmp_path / "broker").start()
    topic = f"pub.{request.param}"
    services.ensure_topic(broker.bootstrap, topic, 2)
    monkeypatch.setenv("KAFKA_CLIENT", request.param)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", broker.bootstrap)
    monkeypatch.setenv("KAFKA_TOPIC", topic)
    monkeypatch.setenv("PUBLISH_TIMEOUT_S", "2")
    settings.cache_clear()
    publisher._discard_producer()
    yield broker, topic
    publisher._discard_producer()
    settings.cache_clear()
    broker.stop()


def _consume(bootstrap: str, topic: str, count: int) -> list:
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10000, group_id=None
    )
    records = []
    for record in consumer:
        records.append(record)
        if len(records) == count:
            break
    consumer.close()
    return records


def test_acknowledged_events_are_on_the_topic(client):
    broker, topic = client
    for i in range(3):
        publisher.publish("42", json.dumps({"n": i}).encode())
    records = _consume(broker.bootstrap, topic, 3)
    assert [json.loads(r.value)["n"] for r in records] == [0, 1, 2]
    assert {r.key for r in records} == {b"42"} and len({r.partition for r in records}) == 1


def test_dead_broker_fails_within_the_timeout_and_a_restarted_one_is_used(client):
    broker, topic = client
    publisher.publish("1", json.dumps({"n": 0}).encode())
    broker.kill()
    started = time.monotonic()
    with pytest.raises(publisher.NotAcknowledged):
        publisher.publish("1", json.dumps({"n": 1}).encode())
    # bounded by PUBLISH_TIMEOUT_S (2 s), not the clients' defaults of a minute or more; slack for a busy machine
    assert time.monotonic() - started < 15
    broker.restart()
    services.ensure_topic(broker.bootstrap, topic, 2)
    deadline = time.monotonic() + 30
    while True:
        try:
            publisher.publish("1", json.dumps({"n": 2}).encode())
            break
        except publisher.NotAcknowledged:
            assert time.monotonic() < deadline, "the publisher never recovered"
    assert json.loads(_consume(broker.bootstrap, topic, 1)[0].value)["n"] == 2


def _produce_batches(bootstrap: str, topic: str, batches: list[tuple[int, int]]) -> dict[int, int]:
    """Each (partition, n): n records sent together and flushed, so a lingering producer puts them in one batch; the
    partition -> next offset the broker acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 500, "acks": "all"})
    ends: dict[int, int] = {}

    def delivered(err, msg) -> None:
        assert err is None, err
        ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    for partition, n in batches:
        for i in range(n):
            producer.produce(topic, partition=partition, value=json.dumps({"n": i}).encode(), on_delivery=delivered)
        producer.flush(10)
    return ends


def test_end_offsets_are_past_every_record_of_multi_record_batches(client):
    """Tansu answers ListOffsets(latest) with its last batch's base offset + 1: 5 records in one batch read as end 1.
    The log hold lifts when the writer's watermark reaches these ends, so an under-reported end lifts it before the
    writer applied the whole log."""
    broker, topic = client
    assert publisher.end_offsets() == {0: 0, 1: 0}
    acknowledged = _produce_batches(broker.bootstrap, topic, [(0, 5), (0, 3), (1, 4)])
    assert acknowledged == {0: 8, 1: 4}
    assert publisher.end_offsets() == acknowledged
