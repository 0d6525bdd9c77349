"""Kafka publisher: one producer per process, acks from all in-sync replicas, keyed by user id so
every event of an account lands in one partition, in order."""
from __future__ import annotations

import functools
import json

from kafka import KafkaProducer
from kafka.errors import KafkaError

from hotledger.config import settings


class PublishFailed(Exception):
    """The broker did not acknowledge the event in time; it may or may not have arrived."""


@functools.lru_cache(maxsize=1)
def _producer() -> KafkaProducer:
    cfg = settings()
    timeout_ms = int(cfg.publish_timeout_s * 1000)
    return KafkaProducer(
        bootstrap_servers=cfg.kafka_bootstrap.split(","),
        security_protocol=cfg.kafka_security_protocol,
        acks="all",
        linger_ms=0,
        retries=2,
        max_block_ms=timeout_ms,
        request_timeout_ms=timeout_ms,
        reconnect_backoff_max_ms=1000,
    )


def publish(key: str, event: dict) -> None:
    """Send and wait for the broker's acknowledgement."""
    cfg = settings()
    try:
        future = _producer().send(cfg.kafka_topic, key=key.encode(), value=json.dumps(event, separators=(",", ":")).encode())
        future.get(timeout=cfg.publish_timeout_s)
    except KafkaError as exc:
        raise PublishFailed(repr(exc)) from exc
