"""Kafka publisher: one producer per process, acks from all in-sync replicas, keyed by user id so
every event of an account lands in one partition, in order. A publish returns only once the broker
acknowledged it, and never waits longer than PUBLISH_TIMEOUT_S.

Two clients behind one function: confluent-kafka (librdkafka; about a ninth of the CPU per
acknowledged publish, measured in bench/) when it is installed, else kafka-python. KAFKA_CLIENT
(`confluent` or `kafka-python`) forces one. Idempotent producers are off: duplicates from retries are
harmless (the writer is idempotent) and their InitProducerId can fail for good after a broker restart.

KAFKA_AUTH=iam (the template's default; MSK Serverless accepts nothing else): SASL_SSL with OAUTHBEARER, the token
a SigV4-signed kafka-cluster:Connect URL made from the function's own credentials by aws-msk-iam-sasl-signer-python
(valid 15 minutes; librdkafka asks oauth_cb again before it expires, kafka-python asks the provider on every
connection). KAFKA_AUTH=none (local): KAFKA_SECURITY_PROTOCOL as given, no client authentication.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hotledger.config import Settings, settings

if TYPE_CHECKING:  # the clients are imported where used: a process loads only the one it runs
    from confluent_kafka import KafkaError

_lock = threading.Lock()
_current: _Confluent | _KafkaPython | None = None


class NotAcknowledged(Exception):
    """The broker did not acknowledge the event in time; it may or may not have arrived."""


class LogUnreadable(Exception):
    """The broker did not tell where its log ends in time."""


def client_name() -> str:
    wanted = os.environ.get("KAFKA_CLIENT", "")
    if wanted:
        return wanted
    return "confluent" if importlib.util.find_spec("confluent_kafka") else "kafka-python"


def msk_iam_token(region: str) -> tuple[str, int]:
    """An MSK IAM auth token for this region and its expiry (epoch ms), signed with the function's credentials."""
    from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

    token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(region)  # the signer is untyped: (str, int)
    return str(token), int(expiry_ms)


def confluent_connection(cfg: Settings) -> dict[str, Any]:
    """How a librdkafka client reaches the brokers and signs in (the producer, the end-offset reader and the setup's
    admin client that creates topics). librdkafka's settings: text, numbers, flags and callbacks (oauth_cb)."""
    config: dict[str, Any] = {
        "bootstrap.servers": cfg.kafka_bootstrap,
        "security.protocol": cfg.kafka_security_protocol.lower(),
    }
    if cfg.kafka_auth == "iam":

        def oauth_cb(_oauth_config: str) -> tuple[str, float]:
            token, expiry_ms = msk_iam_token(cfg.aws_region)
            return token, expiry_ms / 1000  # librdkafka wants the expiry in epoch seconds

        config.update({"security.protocol": "sasl_ssl", "sasl.mechanism": "OAUTHBEARER", "oauth_cb": oauth_cb})
    if "ssl" in config["security.protocol"]:
        config["ssl.ca.location"] = "probe"  # the wheel's own OpenSSL: find the system CA bundle (MSK TLS)
    return config


def msk_iam_token_provider(region: str) -> object:
    """kafka-python's OAUTHBEARER token source: a fresh MSK IAM token per broker connection (imported here: the
    confluent path never loads kafka-python)."""
    from kafka.net.sasl.oauth import AbstractTokenProvider

    # kafka-python ships no types: its base class is Any to mypy (disallow_subclassing_any)
    class MskIamTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
        def token(self) -> str:
            return msk_iam_token(region)[0]

    return MskIamTokenProvider()


def kafka_python_connection(cfg: Settings) -> dict[str, Any]:
    """How a kafka-python client reaches the brokers and signs in (the producer and the end-offset reader): its
    keyword arguments."""
    config: dict[str, Any] = {
        "bootstrap_servers": cfg.kafka_bootstrap.split(","),
        "security_protocol": cfg.kafka_security_protocol,
    }
    if cfg.kafka_auth == "iam":
        config.update(
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "OAUTHBEARER",
                "sasl_oauth_token_provider": msk_iam_token_provider(cfg.aws_region),
            }
        )
    return config


def confluent_config(cfg: Settings) -> dict[str, Any]:
    return {
        **confluent_connection(cfg),
        "acks": "all",
        "enable.idempotence": False,
        "linger.ms": 0,
        "socket.nagle.disable": True,
        "message.timeout.ms": int(cfg.publish_timeout_s * 1000),
    }


def kafka_python_config(cfg: Settings) -> dict[str, Any]:
    timeout_ms = int(cfg.publish_timeout_s * 1000)
    return {
        **kafka_python_connection(cfg),
        "acks": "all",
        "enable_idempotence": False,
        "linger_ms": 0,
        "retries": 2,
        # every wait bounded by the publish timeout: a deduct never hangs on a dead broker
        "max_block_ms": timeout_ms,
        "request_timeout_ms": timeout_ms,
        "delivery_timeout_ms": timeout_ms,
        "bootstrap_timeout_ms": timeout_ms,
        "reconnect_backoff_max_ms": 1000,
    }


# the fetch of a partition's last records: Tansu holds a fetch this long even when it has the records (the clients'
# default, 500 ms, made each end_offsets() half a second)
END_FETCH_WAIT_MS = 10


class _Confluent:
    def __init__(self, cfg: Settings):
        from confluent_kafka import Producer

        self.timeout_s = cfg.publish_timeout_s
        self.connection = confluent_connection(cfg)
        self.producer = Producer(confluent_config(cfg))

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        outcome: dict[str, KafkaError | None] = {}  # "err": the delivery report's error, None when acknowledged

        def delivered(err: KafkaError | None, _msg: object) -> None:
            outcome.setdefault("err", err)

        try:
            self.producer.produce(topic, key=key, value=value, on_delivery=delivered)
        except Exception as exc:  # BufferError when the queue is full, KafkaException for bad config
            raise NotAcknowledged(repr(exc)) from exc
        deadline = time.monotonic() + self.timeout_s
        while "err" not in outcome and time.monotonic() < deadline:
            self.producer.poll(min(0.05, max(deadline - time.monotonic(), 0)))
        if outcome.get("err", "timeout") is not None:
            raise NotAcknowledged(str(outcome.get("err", "no acknowledgement in time")))

    def end_offsets(self, topic: str) -> dict[int, int]:
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        # never subscribes: no group join, only metadata, ListOffsets and one fetch per non-empty partition
        reader = Consumer(
            {
                **self.connection,
                "group.id": "hotledger-end-offsets",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "latest",
                "fetch.wait.max.ms": END_FETCH_WAIT_MS,
            }
        )
        try:
            partitions = reader.list_topics(topic, timeout=self.timeout_s).topics[topic].partitions
            listed = {
                p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=self.timeout_s, cached=False)[1]
                for p in partitions
            }
            ends, unread = dict(listed), {p for p, end in listed.items() if end > 0}
            if unread:
                reader.assign([TopicPartition(topic, p, listed[p] - 1) for p in unread])
            deadline = time.monotonic() + self.timeout_s
            while unread:
                if time.monotonic() > deadline:
                    raise NotAcknowledged(f"the end of partitions {sorted(unread)} not read in time")
                msg = reader.poll(min(0.1, max(deadline - time.monotonic(), 0)))
                if msg is None:
                    continue
                error = msg.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise NotAcknowledged(str(error))
                partition, offset = msg.partition(), msg.offset()
                if partition is None or offset is None:  # librdkafka gives both for a record and for a partition EOF
                    raise NotAcknowledged(f"a fetch answered without its partition or offset: {error}")
                if error is None:
                    ends[partition] = max(ends[partition], offset + 1)
                else:  # the partition's EOF; its offset: where the fetched log ends
                    ends[partition] = max(ends[partition], offset)
                    unread.discard(partition)
            return ends
        finally:
            reader.close()

    def close(self) -> None:
        self.producer.purge()


class _KafkaPython:
    def __init__(self, cfg: Settings):
        from kafka import KafkaProducer

        self.timeout_s = cfg.publish_timeout_s
        self.connection = kafka_python_connection(cfg)
        self.producer = KafkaProducer(**kafka_python_config(cfg))

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        from kafka.errors import KafkaError

        try:
            self.producer.send(topic, key=key, value=value).get(timeout=self.timeout_s)
        except KafkaError as exc:
            raise NotAcknowledged(repr(exc)) from exc

    def end_offsets(self, topic: str) -> dict[int, int]:
        from kafka import KafkaConsumer, TopicPartition

        reader = KafkaConsumer(
            **self.connection,
            request_timeout_ms=int(self.timeout_s * 1000) + 1,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            fetch_max_wait_ms=END_FETCH_WAIT_MS,
        )
        try:
            partitions = reader.partitions_for_topic(topic) or set()
            listed = {
                tp.partition: end
                for tp, end in reader.end_offsets([TopicPartition(topic, p) for p in partitions]).items()
            }
            ends, unread = dict(listed), {TopicPartition(topic, p) for p, end in listed.items() if end > 0}
            reader.assign(list(unread))
            for tp in unread:
                reader.seek(tp, listed[tp.partition] - 1)
            deadline = time.monotonic() + self.timeout_s
            while unread:
                if time.monotonic() > deadline:
                    raise NotAcknowledged(
                        f"the end of partitions {sorted(tp.partition for tp in unread)} not read in time"
                    )
                for tp, records in reader.poll(timeout_ms=100, max_records=100_000).items():
                    ends[tp.partition] = max(ends[tp.partition], *(r.offset + 1 for r in records))
                for tp in list(unread):
                    if reader.highwater(tp) is not None:  # a fetch answered: its high watermark is where the log ends
                        ends[tp.partition] = max(ends[tp.partition], reader.highwater(tp))
                        unread.discard(tp)
            return ends
        finally:
            reader.close()

    def close(self) -> None:
        self.producer.close(timeout=0)


def _producer() -> _Confluent | _KafkaPython:
    global _current
    with _lock:
        if _current is None:
            cfg = settings()
            try:
                _current = (_Confluent if client_name() == "confluent" else _KafkaPython)(cfg)
            except Exception as exc:  # the client could not even bootstrap
                raise NotAcknowledged(repr(exc)) from exc
        return _current


def _discard_producer() -> None:
    """A producer that failed may be in a fatal state: the next publish builds a new one."""
    global _current
    with _lock:
        producer, _current = _current, None
    if producer is not None:
        with contextlib.suppress(Exception):  # closing a broken producer must not hide the publish failure
            producer.close()


def end_offsets(topic: str | None = None) -> dict[int, int]:
    """partition -> the offset the next record of the topic (the configured one unless given; {} for a topic that
    does not exist) will get: every record the log holds now is below it.
    ListOffsets(latest) alone is not enough: Tansu answers it with its last batch's base offset + 1 (5 records in
    one batch: end 1), so each non-empty partition is also read from that offset - 1, and the end is past the last
    record found there and at the fetch's high watermark (on Kafka/MSK, one record and the same end)."""
    try:
        return _producer().end_offsets(topic or settings().kafka_topic)
    except NotAcknowledged as exc:
        raise LogUnreadable(str(exc)) from exc
    except Exception as exc:  # the client's own errors (KafkaException, KafkaError, timeouts): no answer
        raise LogUnreadable(repr(exc)) from exc


def publish(key: str, value: bytes) -> None:
    """Send a record value (a signed event in the layout its MAC is checked in: outbox/events.py signed_value) and
    wait for the broker's acknowledgement."""
    _send(settings().kafka_topic, key.encode(), value)


def republish(topic: str, key: bytes | None, value: bytes) -> None:
    """An operator's replay: a record's bytes as they were (a signed event keeps its MAC), acknowledged or raised."""
    _send(topic, key or b"", value)


def _send(topic: str, key: bytes, value: bytes) -> None:
    try:
        _producer().send(topic, key, value)
    except NotAcknowledged:
        _discard_producer()
        raise


@dataclass(frozen=True)
class LogRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, str]


def read(topic: str, since: dict[int, int], limit: int, until: dict[int, int] | None = None) -> list[LogRecord]:
    """Up to `limit` records of the topic at or past since[partition] (0 where absent), in partition then offset
    order: what an operator looks at and replays (the dead-letter topic) and what a rebuild looks for (outbox/
    log_hold.py), never the hot path, so kafka-python whichever client publishes. {} for a topic that does not exist.
    `until`: partition -> read up to there (end_offsets(): ListOffsets alone misreads Tansu's); only those partitions.
    Raises LogUnreadable."""
    from kafka import KafkaConsumer, TopicPartition

    cfg = settings()
    reader = KafkaConsumer(
        **kafka_python_connection(cfg),
        request_timeout_ms=int(cfg.publish_timeout_s * 1000) + 1,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=0,
    )
    try:
        partitions = sorted(reader.partitions_for_topic(topic) or ())
        if until is not None:
            partitions = [p for p in partitions if p in until]
        tps = [TopicPartition(topic, p) for p in partitions]
        ends = reader.end_offsets(tps) if tps else {}
        if until is not None:
            ends = {tp: until[tp.partition] for tp in tps}
        found: list[LogRecord] = []
        for tp in tps:
            start = max(since.get(tp.partition, 0), reader.beginning_offsets([tp])[tp])
            if start >= ends[tp] or len(found) >= limit:
                continue
            reader.assign([tp])
            reader.seek(tp, start)
            deadline = time.monotonic() + cfg.publish_timeout_s
            while reader.position(tp) < ends[tp] and len(found) < limit and time.monotonic() < deadline:
                for record in reader.poll(timeout_ms=200, max_records=limit - len(found)).get(tp, []):
                    found.append(
                        LogRecord(
                            tp.partition,
                            record.offset,
                            record.key,
                            record.value,
                            {k: (v or b"").decode(errors="replace") for k, v in record.headers or []},
                        )
                    )
        return found[:limit]
    except Exception as exc:  # the client's own errors: no answer
        raise LogUnreadable(repr(exc)) from exc
    finally:
        reader.close()
