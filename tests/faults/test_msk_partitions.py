"""The local runtime's MSK trigger runs a poller per partition (infra/localrt/runtime.py MskPoller), like the event
source mapping: each partition's records reach the function in order, in batches of that partition alone; and a
poller follows a broker that lost its log (Tansu's memory storage, killed) instead of skipping what it holds now.
Private broker (its own port), real topics and group offsets."""

from __future__ import annotations

import base64
import copy
import threading
from collections import defaultdict
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from helpers import LocalService
from infra import services
from infra.localrt import template
from infra.localrt.msk import MskPoller

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def broker(tmp_path):
    broker = services.TansuBroker(services.free_port(), tmp_path / "broker").start()
    yield broker
    broker.stop()


def _trigger(bootstrap: str, topic: str, partitions: int):
    """The writer's trigger as the template configures it, on its own topic and group."""
    fn = copy.deepcopy(next(f for f in template.load(REPO / "template.yaml") if f.name == "WriterFunction"))
    fn.msk.update(topic=topic, group_id=f"{topic}-group", dead_letter_topic=f"{topic}.dead-letter", batch_size=50)
    services.ensure_topic(bootstrap, topic, partitions)
    return fn


class Function:
    """Records each invocation's records as (partition, key, value)."""

    def __init__(self):
        self.lock, self.batches = threading.Lock(), []

    def __call__(self, event, _context):
        batch = [
            (r["partition"], base64.b64decode(r["key"]), base64.b64decode(r["value"]))
            for rs in event["records"].values()
            for r in rs
        ]
        with self.lock:
            self.batches.append(batch)
        return {"batchItemFailures": []}

    @property
    def values(self) -> list[bytes]:
        with self.lock:
            return [value for batch in self.batches for _, _, value in batch]


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], one_by_one: bool) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all", linger_ms=0 if one_by_one else 200)
    for key, value in records:
        producer.send(topic, key=key, value=value)
        if one_by_one:
            producer.flush()
    producer.flush()
    producer.close()


def _committed(bootstrap: str, fn, partition: int) -> int:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap.split(","), group_id=fn.msk["group_id"], enable_auto_commit=False
    )
    try:
        return consumer.committed(TopicPartition(fn.msk["topic"], partition)) or 0
    finally:
        consumer.close()


class Pollers:
    def __init__(self, fn, bootstrap: str, partitions: int, function: Function):
        self.stop = threading.Event()
        self.threads = [MskPoller(fn, bootstrap, self.stop, p, function, partitions) for p in range(partitions)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def test_each_partition_has_its_poller_and_an_accounts_records_stay_in_order(broker):
    fn = _trigger(broker.bootstrap, "partitions.order", 3)
    records = [(b"account-%d" % (i % 7), b"account-%d:%03d" % (i % 7, i)) for i in range(140)]
    _produce(broker.bootstrap, fn.msk["topic"], records, one_by_one=False)
    function = Function()

    with Pollers(fn, broker.bootstrap, 3, function):
        LocalService.wait_until(lambda: len(function.values) >= len(records), 60, "every record delivered", 0.2)
        LocalService.wait_until(
            lambda: sum(_committed(broker.bootstrap, fn, p) for p in range(3)) == len(records),
            30,
            "every partition committed",
            0.5,
        )

    assert sorted(function.values) == sorted(value for _, value in records)  # each once
    assert all(
        len({partition for partition, _, _ in batch}) == 1 for batch in function.batches
    )  # one partition a batch
    by_key = defaultdict(list)
    for key, value in ((k, v) for batch in function.batches for _, k, v in batch):
        by_key[key].append(value)
    assert all(values == sorted(values) for values in by_key.values())  # an account's records in order
    assert len({partition for batch in function.batches for partition, _, _ in batch}) == 3


def test_a_poller_reads_the_partition_again_when_the_broker_lost_its_log(broker):
    fn = _trigger(broker.bootstrap, "partitions.lost", 1)
    function = Function()
    with Pollers(fn, broker.bootstrap, 1, function):
        _produce(broker.bootstrap, fn.msk["topic"], [(b"k", b"before-%d" % i) for i in range(8)], one_by_one=True)
        LocalService.wait_until(lambda: _committed(broker.bootstrap, fn, 0) == 8, 60, "the 8 records committed", 0.2)

        broker.kill()  # memory storage: the log and the group's offsets are gone
        broker.restart()
        services.ensure_topic(broker.bootstrap, fn.msk["topic"], 1)
        after = [(b"k", b"after-%d" % i) for i in range(3)]  # fewer than the poller's position, in one record batch
        _produce(broker.bootstrap, fn.msk["topic"], after, one_by_one=False)

        LocalService.wait_until(
            lambda: {v for _, v in after} <= set(function.values),
            60,
            "the records the restarted broker holds delivered",
            0.2,
        )
    assert function.values[:8] == [b"before-%d" % i for i in range(8)]


def test_a_poller_reads_the_partition_again_when_the_restarted_broker_outgrew_its_position(broker):
    """The broker lost its log while the function ran a batch, and took more records than the poller had read before
    the poller asked again: its position is inside the new log, and only the topic's new id tells that the records
    below it are new."""
    fn = _trigger(broker.bootstrap, "partitions.outgrown", 1)
    in_batch, go_on = threading.Event(), threading.Event()

    class Held(Function):
        def __call__(self, event, context):
            answer = super().__call__(event, context)
            if b"before-3" in self.values[-1:]:
                in_batch.set()
                go_on.wait(60)
            return answer

    function = Held()
    with Pollers(fn, broker.bootstrap, 1, function):
        _produce(broker.bootstrap, fn.msk["topic"], [(b"k", b"before-%d" % i) for i in range(4)], one_by_one=True)
        assert in_batch.wait(60)

        broker.kill()
        broker.restart()
        services.ensure_topic(broker.bootstrap, fn.msk["topic"], 1)
        after = [(b"k", b"after-%d" % i) for i in range(40)]  # far more than the poller's position, at once
        _produce(broker.bootstrap, fn.msk["topic"], after, one_by_one=False)
        go_on.set()

        LocalService.wait_until(
            lambda: {v for _, v in after} <= set(function.values),
            60,
            "every record the restarted broker holds delivered",
            0.2,
        )


def test_the_pollers_take_the_partitions_of_a_topic_made_again_with_more(broker):
    """A broker that lost its log may have the topic made again with more partitions (created on first use with the
    broker's default count, before anyone asked for the old one): every partition has a poller again."""
    fn = _trigger(broker.bootstrap, "partitions.more", 2)
    function = Function()
    with Pollers(fn, broker.bootstrap, 2, function):
        _produce(broker.bootstrap, fn.msk["topic"], [(b"k%d" % i, b"before-%d" % i) for i in range(6)], one_by_one=True)
        LocalService.wait_until(lambda: len(function.values) >= 6, 60, "the records before", 0.2)

        broker.kill()
        broker.restart()
        services.ensure_topic(broker.bootstrap, fn.msk["topic"], 5)
        after = [(b"k%d" % i, b"after-%d" % i) for i in range(60)]  # keyed over all five partitions
        _produce(broker.bootstrap, fn.msk["topic"], after, one_by_one=False)

        LocalService.wait_until(
            lambda: {v for _, v in after} <= set(function.values), 60, "every record of every partition delivered", 0.2
        )
    by_key = defaultdict(list)
    for key, value in ((k, v) for batch in function.batches for _, k, v in batch):
        by_key[key].append(value)
    assert all(values == sorted(values, key=lambda v: (v.startswith(b"after"), v)) for values in by_key.values())
