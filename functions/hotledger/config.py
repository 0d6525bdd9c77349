"""Settings from environment variables with local defaults.

In AWS the DB credentials come from Secrets Manager (DB_SECRET_ARN), the Redis AUTH token from
Secrets Manager (REDIS_AUTH_SECRET_ARN) and tunables may be overridden from SSM (SSM_PARAMETER_PATH).
boto3 honours AWS_ENDPOINT_URL, which is how tests point these calls at LocalStack or moto.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

_REPO_LUA_DIR = Path(__file__).resolve().parents[2] / "layers" / "lua"


@dataclass(frozen=True)
class Settings:
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_password: str | None = None
    db_host: str = "127.0.0.1"
    db_port: int = 3306
    db_user: str = "root"
    db_password: str = ""
    db_name: str = "hotledger"
    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_topic: str = "hotledger.ledger"
    kafka_security_protocol: str = "PLAINTEXT"
    publish_timeout_s: float = 5.0
    entry_ttl_s: int = 7 * 24 * 3600
    idempotency_ttl_s: int = 24 * 3600
    reconcile_age_s: int = 300
    # each part of a reconciler run (accounts, vouchers, packets, journeys, reminders, orders) stops after this many
    # items or seconds, whichever comes first, and the next run continues where it stopped (6 x 8 s < the 60 s timeout)
    reconcile_part_items: int = 1_000_000
    reconcile_part_s: float = 8.0
    reconcile_page: int = 500
    # per account, at most this many pending entries are read in one run (more: persisted oldest first, not corrected)
    reconcile_pending_limit: int = 10_000
    lock_ttl_ms: int = 5000
    lock_wait_ms: int = 3000
    lua_dir: str = str(_REPO_LUA_DIR)
    # "kafka" (MSK) or "redis-stream": the Lua scripts XADD their events to a Redis Stream
    event_transport: str = "kafka"
    stream_shards: int = 1
    stream_group: str = "hotledger-writer"
    stream_batch: int = 1000
    stream_block_ms: int = 1000
    stream_claim_idle_ms: int = 30000
    stream_max_deliveries: int = 5
    # after Redis lost a voucher or red packet, sales on it wait this long after the rebuild from the DB so
    # events acknowledged before the loss reach the DB first (the writer lag bound is ~1 s)
    rebuild_hold_s: int = 10
    # how long Redis keeps the keys of an ended sale or a refunded red packet (a later request rebuilds them)
    finished_keys_ttl_s: int = 24 * 3600
    # delay queue, reminders, inbox
    delay_visibility_ms: int = 30_000
    # a delivery whose handler failed comes back after retry_base * 2^(deliveries-1) ms (capped); after
    # max_deliveries deliveries the element moves to the queue's dead letters (0: never)
    delay_max_deliveries: int = 8
    delay_retry_base_ms: int = 2000
    delay_retry_cap_ms: int = 600_000
    reminder_before_close_s: int = 20 * 60
    inbox_ttl_s: int = 30 * 24 * 3600
    inbox_max_messages: int = 500
    # memory is finite (Redis noeviction): past these a request is refused with 429 and nothing changes
    delay_max_queue_size: int = 100_000  # elements per client delay queue, waiting + taken (QUEUE_FULL)
    max_pending_entries: int = 10_000  # an account's charges in Redis not yet in the DB (TOO_MANY_PENDING)
    # unfinished-business journeys: biz=seconds after which an unfinished start turns into an inbox message
    journeys: str = "password-recovery=1800"


_ENV = {
    "redis_url": "REDIS_URL",
    "redis_password": "REDIS_PASSWORD",
    "db_host": "DB_HOST",
    "db_port": "DB_PORT",
    "db_user": "DB_USER",
    "db_password": "DB_PASSWORD",
    "db_name": "DB_NAME",
    "kafka_bootstrap": "KAFKA_BOOTSTRAP",
    "kafka_topic": "KAFKA_TOPIC",
    "kafka_security_protocol": "KAFKA_SECURITY_PROTOCOL",
    "publish_timeout_s": "PUBLISH_TIMEOUT_S",
    "entry_ttl_s": "ENTRY_TTL_S",
    "idempotency_ttl_s": "IDEMPOTENCY_TTL_S",
    "reconcile_age_s": "RECONCILE_AGE_S",
    "reconcile_part_items": "RECONCILE_PART_ITEMS",
    "reconcile_part_s": "RECONCILE_PART_S",
    "reconcile_page": "RECONCILE_PAGE",
    "reconcile_pending_limit": "RECONCILE_PENDING_LIMIT",
    "lock_ttl_ms": "LOCK_TTL_MS",
    "lock_wait_ms": "LOCK_WAIT_MS",
    "lua_dir": "LUA_DIR",
    "event_transport": "EVENT_TRANSPORT",
    "stream_shards": "STREAM_SHARDS",
    "stream_group": "STREAM_GROUP",
    "stream_batch": "STREAM_BATCH",
    "stream_block_ms": "STREAM_BLOCK_MS",
    "stream_claim_idle_ms": "STREAM_CLAIM_IDLE_MS",
    "stream_max_deliveries": "STREAM_MAX_DELIVERIES",
    "rebuild_hold_s": "REBUILD_HOLD_S",
    "finished_keys_ttl_s": "FINISHED_KEYS_TTL_S",
    "delay_visibility_ms": "DELAY_VISIBILITY_MS",
    "delay_max_deliveries": "DELAY_MAX_DELIVERIES",
    "delay_retry_base_ms": "DELAY_RETRY_BASE_MS",
    "delay_retry_cap_ms": "DELAY_RETRY_CAP_MS",
    "reminder_before_close_s": "REMINDER_BEFORE_CLOSE_S",
    "inbox_ttl_s": "INBOX_TTL_S",
    "inbox_max_messages": "INBOX_MAX_MESSAGES",
    "delay_max_queue_size": "DELAY_MAX_QUEUE_SIZE",
    "max_pending_entries": "MAX_PENDING_ENTRIES",
    "journeys": "JOURNEYS",
}


def _coerce(name: str, raw: str):
    kind = {f.name: f.type for f in fields(Settings)}[name]
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    return raw


def _from_env(env) -> dict:
    return {name: _coerce(name, env[var]) for name, var in _ENV.items() if env.get(var) not in (None, "")}


def _from_secrets(env) -> dict:
    values: dict = {}
    if not (env.get("DB_SECRET_ARN") or env.get("REDIS_AUTH_SECRET_ARN")):
        return values
    import boto3

    client = boto3.client("secretsmanager")
    if env.get("DB_SECRET_ARN"):
        secret = json.loads(client.get_secret_value(SecretId=env["DB_SECRET_ARN"])["SecretString"])
        values["db_user"] = secret["username"]
        values["db_password"] = secret["password"]
        for key, name in (("host", "db_host"), ("port", "db_port"), ("dbname", "db_name")):
            if key in secret and not env.get(_ENV[name]):
                values[name] = _coerce(name, str(secret[key]))
    if env.get("REDIS_AUTH_SECRET_ARN"):
        values["redis_password"] = client.get_secret_value(SecretId=env["REDIS_AUTH_SECRET_ARN"])["SecretString"]
    return values


def _from_ssm(env) -> dict:
    """Tunables under SSM_PARAMETER_PATH, e.g. /hotledger/reconcile_age_s = 120."""
    path = env.get("SSM_PARAMETER_PATH")
    if not path:
        return {}
    import boto3

    tunable = {"publish_timeout_s", "entry_ttl_s", "idempotency_ttl_s", "reconcile_age_s", "reconcile_part_items",
               "reconcile_part_s", "reconcile_page", "reconcile_pending_limit", "lock_ttl_ms", "lock_wait_ms",
               "stream_batch", "stream_block_ms", "stream_claim_idle_ms", "stream_max_deliveries", "rebuild_hold_s",
               "finished_keys_ttl_s", "delay_visibility_ms", "delay_max_deliveries", "delay_retry_base_ms",
               "delay_retry_cap_ms", "reminder_before_close_s", "inbox_ttl_s", "inbox_max_messages", "journeys",
               "delay_max_queue_size", "max_pending_entries"}
    values = {}
    pages = boto3.client("ssm").get_paginator("get_parameters_by_path").paginate(Path=path, Recursive=False)
    for page in pages:
        for param in page["Parameters"]:
            name = param["Name"].rsplit("/", 1)[-1]
            if name in tunable:
                values[name] = _coerce(name, param["Value"])
    return values


def build_settings(env=None) -> Settings:
    env = os.environ if env is None else env
    # precedence: explicit env var > secret > SSM > default
    merged = {**_from_ssm(env), **_from_secrets(env), **_from_env(env)}
    cfg = replace(Settings(), **merged)
    if cfg.event_transport not in ("kafka", "redis-stream"):
        raise ValueError(f"EVENT_TRANSPORT must be kafka or redis-stream, not {cfg.event_transport!r}")
    return cfg


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    """Process-wide settings, read once per Lambda container."""
    return build_settings()
