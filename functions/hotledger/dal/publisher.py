"""Kafka publisher: one producer per process, acks from all in-sync replicas, keyed by user id so
every event of an account lands in one partition, in order. A publish returns only once the broker
acknowledged it, and never waits longer than PUBLISH_TIMEOUT_S.

Two clients behind one function: confluent-kafka (librdkafka; about a ninth of the CPU per
acknowledged publish, measured in bench/) when it is installed, else kafka-python. KAFKA_CLIENT
(`confluent` or `kafka-python`) forces one. Idempotent producers are off: duplicates from retries are
harmless (the writer is idempotent) and their InitProducerId can fail for good after a broker restart.
"""
from __future__ import annotations

import importlib.util
import json
import os
import threading
import time

from hotledger.config import Settings, settings

_lock = threading.Lock()
_current = None


class NotAcknowledged(Exception):
    """The broker did not acknowledge the event in time; it may or may not have arrived."""


def client_name() -> str:
    wanted = os.environ.get("KAFKA_CLIENT", "")
    if wanted:
        return wanted
    return "confluent" if importlib.util.find_spec("confluent_kafka") else "kafka-python"


class _Confluent:
    def __init__(self, cfg: Settings):
        from confluent_kafka import Producer

        self.timeout_s = cfg.publish_timeout_s
        config = {
            "bootstrap.servers": cfg.kafka_bootstrap,
            "security.protocol": cfg.kafka_security_protocol.lower(),
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": 0,
            "socket.nagle.disable": True,
            "message.timeout.ms": int(cfg.publish_timeout_s * 1000),
        }
        if "ssl" in config["security.protocol"]:
            config["ssl.ca.location"] = "probe"  # the wheel's own OpenSSL: find the system CA bundle (MSK TLS)
        self.producer = Producer(config)

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        outcome: dict = {}
        try:
            self.producer.produce(topic, key=key, value=value, on_delivery=lambda err, _msg: outcome.setdefault("err", err))
        except Exception as exc:  # BufferError when the queue is full, KafkaException for bad config
            raise NotAcknowledged(repr(exc)) from exc
        deadline = time.monotonic() + self.timeout_s
        while "err" not in outcome and time.monotonic() < deadline:
            self.producer.poll(min(0.05, max(deadline - time.monotonic(), 0)))
        if outcome.get("err", "timeout") is not None:
            raise NotAcknowledged(str(outcome.get("err", "no acknowledgement in time")))

    def close(self) -> None:
        self.producer.purge()


class _KafkaPython:
    def __init__(self, cfg: Settings):
        from kafka import KafkaProducer

        timeout_ms = int(cfg.publish_timeout_s * 1000)
        self.timeout_s = cfg.publish_timeout_s
        self.producer = KafkaProducer(
            bootstrap_servers=cfg.kafka_bootstrap.split(","),
            security_protocol=cfg.kafka_security_protocol,
            acks="all",
            enable_idempotence=False,
            linger_ms=0,
            retries=2,
            # every wait bounded by the publish timeout: a deduct never hangs on a dead broker
            max_block_ms=timeout_ms,
            request_timeout_ms=timeout_ms,
            delivery_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms,
            reconnect_backoff_max_ms=1000,
        )

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        from kafka.errors import KafkaError

        try:
            self.producer.send(topic, key=key, value=value).get(timeout=self.timeout_s)
        except KafkaError as exc:
            raise NotAcknowledged(repr(exc)) from exc

    def close(self) -> None:
        self.producer.close(timeout=0)


def _producer():
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
        try:
            producer.close()
        except Exception:  # closing a broken producer must not hide the publish failure
            pass


def publish(key: str, event: dict) -> None:
    """Send and wait for the broker's acknowledgement."""
    try:
        _producer().send(settings().kafka_topic, key.encode(), json.dumps(event, separators=(",", ":")).encode())
    except NotAcknowledged:
        _discard_producer()
        raise
