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
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


@dataclass(frozen=True)
class Settings:
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_password: str | None = None
    redis_username: str | None = None  # an ElastiCache RBAC user (AUTH username password); None: the default user
    # "1": REDIS_URL names a Redis Cluster node (the ElastiCache configuration endpoint); a redis+cluster:// or
    # rediss+cluster:// URL says the same
    redis_cluster: str = "0"
    db_host: str = "127.0.0.1"
    db_port: int = 3306
    db_user: str = "root"
    db_password: str = ""
    db_name: str = "hotledger"
    db_secret_arn: str = ""  # read again (bypassing the cache) when the DB refuses the credentials: rotation
    # "verify": TLS with the server's certificate and host name checked against db_ca_bundle ("certifi": the Mozilla
    # bundle of the certifi package, with the Amazon Root CAs that sign RDS Proxy's certificates; else a PEM file, such
    # as the RDS global bundle for a direct RDS/Aurora endpoint); "off": plain (local)
    db_tls: str = "off"
    db_ca_bundle: str = ""
    secrets_max_age_s: int = 300  # Secrets Manager values are cached this long per container
    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_topic: str = "hotledger.ledger"
    kafka_security_protocol: str = "PLAINTEXT"
    # "iam": SASL_SSL + OAUTHBEARER with the function's IAM credentials (MSK); "none": KAFKA_SECURITY_PROTOCOL as is
    kafka_auth: str = "none"
    aws_region: str = ""  # Lambda sets AWS_REGION: the MSK IAM token is signed for it
    publish_timeout_s: float = 5.0
    # the keyring that signs Kafka events (dal/event_keys.py): a Secrets Manager secret in AWS, the JSON itself locally
    event_keys_secret_arn: str = ""
    event_keys: str = ""
    event_keys_max_age_s: int = 300
    entry_ttl_s: int = 7 * 24 * 3600
    idempotency_ttl_s: int = 24 * 3600
    reconcile_age_s: int = 300
    # each part of a reconciler run (accounts, vouchers, packets, journeys, reminders, orders) stops after this many
    # items or seconds, whichever comes first, and the next run continues where it stopped (7 x 8 s < the 60 s timeout)
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
    # after Redis lost a voucher or red packet, sales on it wait at least this long after the rebuild from the DB
    # (with Kafka also at least PUBLISH_TIMEOUT_S, and then until the writer applied the log: outbox/log_hold.py)
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
    # new route Idempotency-Keys a scope (an account, a payment order) opens per IDEMPOTENCY_TTL_S window (TOO_MANY_KEYS)
    max_idempotency_keys: int = 100_000
    # how long an attempt holds its route key: above the API function's timeout, so a live attempt never loses it
    idempotency_lease_ms: int = 60_000
    # how long the DB keeps an Idempotency-Key's answer (t_idempotency, t_route_key) and a rollback's record
    # (t_rolled_back): the reconciler prunes older ones in bounded batches. Keep it above the topic's retention, so a
    # replay from the log's start still meets every rollback record (Stripe keeps keys 24 h)
    key_retention_days: int = 30
    # "1": webhook endpoints may also be http://127.0.0.1 or http://localhost (local receivers; never in AWS)
    webhook_allow_local: str = "0"
    # unfinished-business journeys: biz=seconds after which an unfinished start turns into an inbox message
    journeys: str = "password-recovery=1800"


    @property
    def redis_is_cluster(self) -> bool:
        return self.redis_cluster == "1" or self.redis_url.split("://", 1)[0] in CLUSTER_SCHEMES

    @property
    def rebuild_hold_ms(self) -> int:
        """The time hold of a rebuild: with Kafka, a publish in flight at the loss is acknowledged (or rolled back)
        within PUBLISH_TIMEOUT_S, so where the log ends is read no sooner."""
        floor_s = self.publish_timeout_s if self.event_transport == "kafka" else 0
        return int(max(self.rebuild_hold_s, floor_s) * 1000)


_ENV = {
    "redis_url": "REDIS_URL",
    "redis_password": "REDIS_PASSWORD",
    "redis_username": "REDIS_USERNAME",
    "redis_cluster": "REDIS_CLUSTER",
    "db_host": "DB_HOST",
    "db_port": "DB_PORT",
    "db_user": "DB_USER",
    "db_password": "DB_PASSWORD",
    "db_name": "DB_NAME",
    "db_secret_arn": "DB_SECRET_ARN",
    "db_tls": "DB_TLS",
    "db_ca_bundle": "DB_CA_BUNDLE",
    "secrets_max_age_s": "SECRETS_MAX_AGE_S",
    "kafka_bootstrap": "KAFKA_BOOTSTRAP",
    "kafka_topic": "KAFKA_TOPIC",
    "kafka_security_protocol": "KAFKA_SECURITY_PROTOCOL",
    "kafka_auth": "KAFKA_AUTH",
    "aws_region": "AWS_REGION",
    "publish_timeout_s": "PUBLISH_TIMEOUT_S",
    "event_keys_secret_arn": "EVENT_KEYS_SECRET_ARN",
    "event_keys": "EVENT_KEYS",
    "event_keys_max_age_s": "EVENT_KEYS_MAX_AGE_S",
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
    "max_idempotency_keys": "MAX_IDEMPOTENCY_KEYS",
    "idempotency_lease_ms": "IDEMPOTENCY_LEASE_MS",
    "key_retention_days": "KEY_RETENTION_DAYS",
    "webhook_allow_local": "WEBHOOK_ALLOW_LOCAL",
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


def secret_value(secret_id: str, max_age_s: int, fresh: bool = False) -> str:
    """A Secrets Manager value through Powertools parameters: cached max_age_s per container, `fresh` reads it again."""
    from aws_lambda_powertools.utilities import parameters

    return parameters.get_secret(secret_id, max_age=max_age_s, force_fetch=fresh)


def db_credentials(secret: str, env) -> dict:
    """Settings from the DB secret (username, password; host, port, dbname unless set by their variables)."""
    value = json.loads(secret)
    values = {"db_user": value["username"], "db_password": value["password"]}
    for key, name in (("host", "db_host"), ("port", "db_port"), ("dbname", "db_name")):
        if key in value and not env.get(_ENV[name]):
            values[name] = _coerce(name, str(value[key]))
    return values


def _from_secrets(env) -> dict:
    values: dict = {}
    max_age_s = int(env.get("SECRETS_MAX_AGE_S") or Settings.secrets_max_age_s)
    if env.get("DB_SECRET_ARN"):
        values.update(db_credentials(secret_value(env["DB_SECRET_ARN"], max_age_s), env))
    if env.get("REDIS_AUTH_SECRET_ARN"):
        values["redis_password"] = secret_value(env["REDIS_AUTH_SECRET_ARN"], max_age_s)
    return values


# the settings an operator may change under SSM_PARAMETER_PATH without a deploy
SSM_TUNABLES = frozenset({
    "publish_timeout_s", "entry_ttl_s", "idempotency_ttl_s", "reconcile_age_s", "reconcile_part_items",
    "reconcile_part_s", "reconcile_page", "reconcile_pending_limit", "lock_ttl_ms", "lock_wait_ms", "stream_batch",
    "stream_block_ms", "stream_claim_idle_ms", "stream_max_deliveries", "rebuild_hold_s", "finished_keys_ttl_s",
    "delay_visibility_ms", "delay_max_deliveries", "delay_retry_base_ms", "delay_retry_cap_ms",
    "reminder_before_close_s", "inbox_ttl_s", "inbox_max_messages", "journeys", "delay_max_queue_size",
    "max_pending_entries", "max_idempotency_keys", "key_retention_days"})


def _from_ssm(env) -> dict:
    """Tunables under SSM_PARAMETER_PATH, e.g. /hotledger/reconcile_age_s = 120."""
    path = env.get("SSM_PARAMETER_PATH")
    if not path:
        return {}
    import boto3

    values = {}
    pages = boto3.client("ssm").get_paginator("get_parameters_by_path").paginate(Path=path, Recursive=False)
    for page in pages:
        for param in page["Parameters"]:
            name = param["Name"].rsplit("/", 1)[-1]
            if name in SSM_TUNABLES:
                values[name] = _coerce(name, param["Value"])
    return values


def build_settings(env=None) -> Settings:
    env = os.environ if env is None else env
    # precedence: explicit env var > secret > SSM > default
    merged = {**_from_ssm(env), **_from_secrets(env), **_from_env(env)}
    cfg = replace(Settings(), **merged)
    if cfg.event_transport not in ("kafka", "redis-stream"):
        raise ValueError(f"EVENT_TRANSPORT must be kafka or redis-stream, not {cfg.event_transport!r}")
    if cfg.redis_cluster not in ("0", "1"):
        raise ValueError(f"REDIS_CLUSTER must be 0 or 1, not {cfg.redis_cluster!r}")
    if cfg.db_tls not in ("verify", "off"):
        raise ValueError(f"DB_TLS must be verify or off, not {cfg.db_tls!r}")
    if cfg.db_tls == "verify" and not cfg.db_ca_bundle:
        raise ValueError("DB_TLS=verify checks the server against a CA bundle: set DB_CA_BUNDLE (certifi or a PEM path)")
    if cfg.kafka_auth not in ("iam", "none"):
        raise ValueError(f"KAFKA_AUTH must be iam or none, not {cfg.kafka_auth!r}")
    if cfg.kafka_auth == "iam" and not cfg.aws_region:
        raise ValueError("KAFKA_AUTH=iam signs its token for a region: set AWS_REGION")
    return cfg


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    """Process-wide settings, read once per Lambda container."""
    return build_settings()
