"""Kafka publisher: one producer per process, acks from all in-sync replicas, keyed by user id so
every event of an account lands in one partition, in order."""
from __future__ import annotations

import json
import threading

from kafka import KafkaProducer
from kafka.errors import KafkaError

from hotledger.config import settings

_lock = threading.Lock()
_current: KafkaProducer | None = None


class PublishFailed(Exception):
    """The broker did not acknowledge the event in time; it may or may not have arrived."""


def _producer() -> KafkaProducer:
    global _current
    with _lock:
        if _current is None:
            cfg = settings()
            timeout_ms = int(cfg.publish_timeout_s * 1000)
            _current = KafkaProducer(
                bootstrap_servers=cfg.kafka_bootstrap.split(","),
                security_protocol=cfg.kafka_security_protocol,
                acks="all",
                # duplicates from retries are harmless (the writer is idempotent); the idempotent
                # producer's InitProducerId can fail for good after a broker restart
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
        return _current


def _discard_producer() -> None:
    """A producer that failed may be in a fatal state: the next publish builds a new one."""
    global _current
    with _lock:
        producer, _current = _current, None
    if producer is not None:
        try:
            producer.close(timeout=0)
        except KafkaError:
            pass


def publish(key: str, event: dict) -> None:
    """Send and wait for the broker's acknowledgement."""
    cfg = settings()
    try:
        future = _producer().send(cfg.kafka_topic, key=key.encode(), value=json.dumps(event, separators=(",", ":")).encode())
        future.get(timeout=cfg.publish_timeout_s)
    except KafkaError as exc:
        _discard_producer()
        raise PublishFailed(repr(exc)) from exc
