"""The local runtime's MSK trigger keeps the error contract template.yaml gives the writer's event source mapping
(MaximumRetryAttempts, MaximumRecordAgeInSeconds, BisectBatchOnFunctionError, ReportBatchItemFailures, a kafka://
on-failure destination): a poison record neither blocks its partition forever nor disappears - it lands, whole, on
the dead-letter topic and the partition moves on. Real broker (Tansu), real consumer group, real topics."""

from __future__ import annotations

import copy
import os
import threading
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from infra import services
from infra.localrt import template
from infra.localrt.msk import MskPoller

REPO = Path(__file__).resolve().parents[2]
POISON = b"poison"


@pytest.fixture
def trigger(settings):
    """The writer's trigger as the template configures it, on a fresh topic, group and dead-letter topic."""
    writer = next(fn for fn in template.load(REPO / "template.yaml") if fn.name == "WriterFunction")
    fn = copy.deepcopy(writer)
    name = f"contract-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fn.msk.update(topic=name, group_id=f"{name}-group", dead_letter_topic=f"{name}.dead-letter", batch_size=50)
    services.ensure_topic(settings.kafka_bootstrap, name, 1)
    return fn, settings.kafka_bootstrap


def _produce(bootstrap: str, topic: str, values: list[bytes], timestamp_ms: int | None = None) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all")
    for i, value in enumerate(values):
        producer.send(topic, key=b"k%d" % i, value=value, headers=[("origin", b"test")], timestamp_ms=timestamp_ms)
    producer.flush()
    producer.close()


def _drive(
    fn, bootstrap: str, handler, until_committed: int, serve=None, hole_wait_s: float | None = None
) -> MskPoller:
    """Run the trigger's poll loop with this handler until the group committed `until_committed` records.
    `serve(poll)`: what the consumer's fetches return instead of the broker's answers as they are."""
    poller = MskPoller(fn, bootstrap, threading.Event(), 0, handler)  # the topic's one partition
    poller.commit_delay_s, poller.retry_backoff_s = 0.0, 0.01
    poller.HOLE_WAIT_S = poller.HOLE_WAIT_S if hole_wait_s is None else hole_wait_s
    consumer = poller._consumer()
    if serve is not None:
        consumer.poll = serve(consumer.poll)
    tp = TopicPartition(fn.msk["topic"], 0)
    try:
        deadline = time.monotonic() + 120
        while (consumer.committed(tp) or 0) < until_committed:
            assert time.monotonic() < deadline, f"committed {consumer.committed(tp)} of {until_committed}"
            poller._poll_once(consumer, handler)
    finally:
        consumer.close(autocommit=False)
    return poller


def _dead_letters(bootstrap: str, topic: str, expected: int) -> list:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap.split(","),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    records = list(consumer)
    consumer.close()
    assert len(records) == expected, [r.value for r in records]
    return records


class Invocations:
    """A function under the trigger: records what it was given; fails on the poison record as told."""

    def __init__(self, fail):
        self.fail, self.batches, self.handled = fail, [], []

    def __call__(self, event, _context):
        import base64

        records = [r for rs in event["records"].values() for r in rs]
        values = [base64.b64decode(r["value"]) for r in records]
        self.batches.append(values)
        answer = self.fail(records, values)
        failed = {f["itemIdentifier"]["offset"] for f in (answer or {}).get("batchItemFailures", [])}
        self.handled += [v for r, v in zip(records, values, strict=False) if r["offset"] not in failed]
        return answer


def _raise_on_poison(records, values):
    if POISON in values:
        raise RuntimeError("this record crashes the function")
    return {"batchItemFailures": []}


def _report_poison(records, values):
    return {
        "batchItemFailures": [
            {"itemIdentifier": {"partition": f"{r['topic']}-{r['partition']}", "offset": r["offset"]}}
            for r, v in zip(records, values, strict=False)
            if v == POISON
        ]
    }


def test_a_record_that_crashes_the_function_is_isolated_retried_then_dead_lettered_whole(trigger):
    fn, bootstrap = trigger
    values = [b"r%d" % i for i in range(20)]
    values[7] = POISON
    _produce(bootstrap, fn.msk["topic"], values)
    function = Invocations(_raise_on_poison)

    _drive(fn, bootstrap, function, until_committed=20)  # the partition moved past the poison

    assert set(function.handled) == set(values) - {POISON}  # every other record reached the function
    alone = [batch for batch in function.batches if batch == [POISON]]
    assert len(alone) == fn.msk["max_retries"] + 1  # bisected down to itself, then the template's retries
    [dead] = _dead_letters(bootstrap, fn.msk["dead_letter_topic"], 1)
    headers = dict(dead.headers)
    assert (dead.key, dead.value, headers["origin"]) == (b"k7", POISON, b"test")  # the whole record
    assert headers["source-offset"] == b"7" and b"MaximumRetryAttempts" in headers["failure-reason"]


def test_a_reported_record_is_retried_from_there_then_dead_lettered_and_the_rest_go_on(trigger):
    fn, bootstrap = trigger
    values = [b"r%d" % i for i in range(10)]
    values[3] = POISON
    _produce(bootstrap, fn.msk["topic"], values)
    function = Invocations(_report_poison)

    _drive(fn, bootstrap, function, until_committed=10)

    assert set(function.handled) == set(values) - {POISON}
    assert sum(batch[0] == POISON for batch in function.batches) == fn.msk["max_retries"]  # retried from it
    [dead] = _dead_letters(bootstrap, fn.msk["dead_letter_topic"], 1)
    assert dead.value == POISON and dead.headers and dict(dead.headers)["source-offset"] == b"3"


def test_records_older_than_the_maximum_age_go_to_the_dead_letter_topic_without_an_invocation(trigger):
    fn, bootstrap = trigger
    too_old = int(time.time() * 1000) - (fn.msk["max_record_age_s"] + 60) * 1000
    _produce(bootstrap, fn.msk["topic"], [b"old0", b"old1"], timestamp_ms=too_old)
    function = Invocations(_raise_on_poison)

    _drive(fn, bootstrap, function, until_committed=2)

    assert function.batches == []
    dead = _dead_letters(bootstrap, fn.msk["dead_letter_topic"], 2)
    assert [d.value for d in dead] == [b"old0", b"old1"]
    assert all(b"MaximumRecordAgeInSeconds" in dict(d.headers)["failure-reason"] for d in dead)


def served_late(offset: int, times: int = 1):
    """The broker's first answer holding `offset` and a record above it leaves `offset` out: as Tansu served records
    under concurrent producers in make bench (offsets 11277, 11278 and 11280 fetched, 11279, produced a millisecond
    before 11280, on a later fetch). The consumer's position passes it, as it did there. `times`: so many answers
    leave it out."""

    def serve(poll):
        withheld = []

        def poll_serving_late(*args, **kwargs):
            polled = poll(*args, **kwargs)
            for tp, records in polled.items():
                offsets = [r.offset for r in records]
                if len(withheld) < times and offset in offsets and max(offsets) > offset:
                    withheld.append(offset)
                    polled[tp] = [r for r in records if r.offset != offset]
            return polled

        return poll_serving_late

    return serve


def test_a_record_the_broker_serves_after_the_one_above_it_is_still_delivered(trigger):
    fn, bootstrap = trigger
    values = [b"r%d" % i for i in range(10)]
    _produce(bootstrap, fn.msk["topic"], values)
    function = Invocations(_raise_on_poison)

    poller = _drive(fn, bootstrap, function, until_committed=10, serve=served_late(5))

    assert sorted(function.handled) == sorted(values)  # r5 too, once the broker served it
    assert poller.holes == {}


def test_a_hole_that_stays_is_passed_after_the_wait_and_the_partition_goes_on(trigger):
    """An offset that never comes (on Kafka: a transaction marker, a compacted record) holds its partition only for
    the poller's HOLE_WAIT_S."""
    fn, bootstrap = trigger
    values = [b"r%d" % i for i in range(10)]
    _produce(bootstrap, fn.msk["topic"], values)
    function = Invocations(_raise_on_poison)

    poller = _drive(fn, bootstrap, function, until_committed=10, serve=served_late(5, times=10**9), hole_wait_s=0.3)

    assert sorted(function.handled) == sorted(set(values) - {b"r5"}) and poller.holes == {}
