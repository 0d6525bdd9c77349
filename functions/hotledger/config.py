"""Settings: one pydantic-settings model with every setting's type, range and default, and which of them an operator
may tune in SSM without a deploy (TUNABLE). Each setting is read from the environment variable of its upper-case name.

Precedence, highest first: an environment variable; in AWS, Secrets Manager (DB_SECRET_ARN: the DB credentials;
REDIS_AUTH_SECRET_ARN: the Redis AUTH token); the tunables under SSM_PARAMETER_PATH (Powertools parameters); the
default. A value out of its type or range stops the function at its start with the variable named. boto3 honours
AWS_ENDPOINT_URL, which is how tests point these calls at LocalStack or moto.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic.config import JsonDict
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

_REPO_LUA_DIR = Path(__file__).resolve().parents[2] / "layers" / "lua"
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
TUNABLE: JsonDict = {"tunable": True}  # json_schema_extra of a setting SSM may change


class Settings(BaseSettings):
    """Settings(...) alone is its arguments over the defaults (tests); build_settings() reads the sources."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_password: str | None = None
    redis_username: str | None = None  # an ElastiCache RBAC user (AUTH username password); None: the default user
    # "1": REDIS_URL names Redis Cluster seed nodes (the ElastiCache configuration endpoint, or several nodes
    # comma-separated: dal/redis_store.cluster_seeds); a redis+cluster:// or rediss+cluster:// URL says the same
    redis_cluster: Literal["0", "1"] = "0"
    db_host: str = "127.0.0.1"
    db_port: int = Field(3306, gt=0, le=65535)
    db_user: str = "root"
    db_password: str = ""
    db_name: str = "hotledger"
    db_secret_arn: str = ""  # read again (bypassing the cache) when the DB refuses the credentials: rotation
    # "verify": TLS with the server's certificate and host name checked against db_ca_bundle ("certifi": the Mozilla
    # bundle of the certifi package, with the Amazon Root CAs that sign RDS Proxy's certificates; else a PEM file, such
    # as the RDS global bundle for a direct RDS/Aurora endpoint); "off": plain (local)
    db_tls: Literal["verify", "off"] = "off"
    db_ca_bundle: str = ""
    secrets_max_age_s: int = Field(300, gt=0)  # Secrets Manager values are cached this long per container
    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_topic: str = "hotledger.ledger"
    kafka_security_protocol: str = "PLAINTEXT"
    # "iam": SASL_SSL + OAUTHBEARER with the function's IAM credentials (MSK); "none": KAFKA_SECURITY_PROTOCOL as is
    kafka_auth: Literal["iam", "none"] = "none"
    aws_region: str = ""  # Lambda sets AWS_REGION: the MSK IAM token is signed for it
    publish_timeout_s: float = Field(5.0, gt=0, json_schema_extra=TUNABLE)
    # the keyring that signs Kafka events (dal/event_keys.py): a Secrets Manager secret in AWS, the JSON itself locally
    event_keys_secret_arn: str = ""
    event_keys: str = ""
    event_keys_max_age_s: int = Field(300, ge=0)
    entry_ttl_s: int = Field(7 * 24 * 3600, gt=0, json_schema_extra=TUNABLE)
    idempotency_ttl_s: int = Field(24 * 3600, gt=0, json_schema_extra=TUNABLE)
    reconcile_age_s: int = Field(300, gt=0, json_schema_extra=TUNABLE)
    # each part of a reconciler run (accounts, vouchers, packets, journeys, reminders, orders) stops after this many
    # items or seconds, whichever comes first, and the next run continues where it stopped (7 x 8 s < the 60 s timeout)
    reconcile_part_items: int = Field(1_000_000, gt=0, json_schema_extra=TUNABLE)
    reconcile_part_s: float = Field(8.0, gt=0, json_schema_extra=TUNABLE)
    reconcile_page: int = Field(500, gt=0, json_schema_extra=TUNABLE)
    # per account, at most this many pending entries are read in one run (more: persisted oldest first, not corrected)
    reconcile_pending_limit: int = Field(10_000, gt=0, json_schema_extra=TUNABLE)
    lock_ttl_ms: int = Field(5000, gt=0, json_schema_extra=TUNABLE)
    lock_wait_ms: int = Field(3000, gt=0, json_schema_extra=TUNABLE)
    lua_dir: str = str(_REPO_LUA_DIR)
    # "kafka" (MSK) or "redis-stream": the Lua scripts XADD their events to a Redis Stream
    event_transport: Literal["kafka", "redis-stream"] = "kafka"
    stream_shards: int = Field(1, gt=0)
    stream_group: str = "hotledger-writer"
    stream_batch: int = Field(1000, gt=0, json_schema_extra=TUNABLE)
    stream_block_ms: int = Field(1000, gt=0, json_schema_extra=TUNABLE)
    stream_claim_idle_ms: int = Field(30000, gt=0, json_schema_extra=TUNABLE)
    stream_max_deliveries: int = Field(5, gt=0, json_schema_extra=TUNABLE)
    # after Redis lost a voucher or red packet, sales on it wait at least this long after the rebuild from the DB, and
    # so do an account's charges under Idempotency-Keys it does not know
    # (with Kafka also at least PUBLISH_TIMEOUT_S, and then until the writer applied the log: outbox/log_hold.py)
    rebuild_hold_s: int = Field(10, ge=0, json_schema_extra=TUNABLE)
    # how long Redis keeps the keys of an ended sale or a refunded red packet (a later request rebuilds them)
    finished_keys_ttl_s: int = Field(24 * 3600, gt=0, json_schema_extra=TUNABLE)
    # delay queue, reminders, inbox
    delay_visibility_ms: int = Field(30_000, gt=0, json_schema_extra=TUNABLE)
    # a delivery whose handler failed comes back after retry_base * 2^(deliveries-1) ms (capped); after
    # max_deliveries deliveries the element moves to the queue's dead letters (0: never)
    delay_max_deliveries: int = Field(8, ge=0, json_schema_extra=TUNABLE)
    delay_retry_base_ms: int = Field(2000, gt=0, json_schema_extra=TUNABLE)
    delay_retry_cap_ms: int = Field(600_000, gt=0, json_schema_extra=TUNABLE)
    reminder_before_close_s: int = Field(20 * 60, gt=0, json_schema_extra=TUNABLE)
    inbox_ttl_s: int = Field(30 * 24 * 3600, gt=0, json_schema_extra=TUNABLE)
    inbox_max_messages: int = Field(500, gt=0, json_schema_extra=TUNABLE)
    # memory is finite (Redis noeviction): past these a request is refused with 429 and nothing changes
    # 0 in these three: no limit
    delay_max_queue_size: int = Field(100_000, ge=0, json_schema_extra=TUNABLE)  # per client delay queue (QUEUE_FULL)
    max_pending_entries: int = Field(
        10_000, ge=0, json_schema_extra=TUNABLE
    )  # charges not in the DB yet (TOO_MANY_PENDING)
    # new route Idempotency-Keys a scope (an account, a payment order) opens per IDEMPOTENCY_TTL_S window (TOO_MANY_KEYS)
    max_idempotency_keys: int = Field(100_000, ge=0, json_schema_extra=TUNABLE)
    # how long an attempt holds its route key: above the API function's timeout, so a live attempt never loses it
    idempotency_lease_ms: int = Field(60_000, gt=0)
    # how long the DB keeps an Idempotency-Key's answer (t_idempotency, t_route_key) and a rollback's record
    # (t_rolled_back): the reconciler prunes older ones in bounded batches. Keep it above the topic's retention, so a
    # replay from the log's start still meets every rollback record (Stripe keeps keys 24 h). Writer and stream dead
    # letters are replayable for this less 8 days (ops/service.py: what the rollback records can still judge)
    key_retention_days: int = Field(30, gt=0, json_schema_extra=TUNABLE)
    # how long the DB keeps a DELIVERED or DEAD webhook delivery (from its last attempt) and a balance monitor's crossing
    # posted to the inbox: the reconciler's `webhooks` part prunes older ones, and a deleted endpoint's rows, in batches
    webhook_retention_days: int = Field(30, gt=0, json_schema_extra=TUNABLE)
    # live webhook endpoints at most (the stack is one tenant; Stripe: 16): each multiplies every event's deliveries
    webhook_max_endpoints: int = Field(16, gt=0, json_schema_extra=TUNABLE)
    # the function that makes the webhook sender's HTTP POSTs, outside the VPC (the stack's VPC has no NAT); empty: the
    # sender posts itself (locally, or a VPC whose subnets route to a NAT)
    webhook_poster_function: str = ""
    # the KMS key webhook signing secrets are sealed under (envelope: webhooks/secrets.py); empty: kept as they are (local)
    webhook_secrets_key_id: str = ""
    # the currency (ISO 4217) of an account created without one, and of every account created before currencies
    default_currency: str = Field("USD", pattern=r"^[A-Z]{3}$")
    # "1": webhook endpoints may also be http://127.0.0.1 or http://localhost (local receivers; never in AWS)
    webhook_allow_local: Literal["0", "1"] = "0"
    # unfinished-business journeys: biz=seconds after which an unfinished start turns into an inbox message
    journeys: str = Field("password-recovery=1800", json_schema_extra=TUNABLE)

    @property
    def redis_is_cluster(self) -> bool:
        return self.redis_cluster == "1" or self.redis_url.split("://", 1)[0] in CLUSTER_SCHEMES

    @property
    def rebuild_hold_ms(self) -> int:
        """The time hold of a rebuild: with Kafka, a publish in flight at the loss is acknowledged (or rolled back)
        within PUBLISH_TIMEOUT_S, so where the log ends is read no sooner."""
        floor_s = self.publish_timeout_s if self.event_transport == "kafka" else 0
        return int(max(self.rebuild_hold_s, floor_s) * 1000)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        from hotledger.money import MINOR_UNITS

        if self.default_currency not in MINOR_UNITS:
            raise ValueError(f"DEFAULT_CURRENCY {self.default_currency} is not a supported currency")
        if self.db_tls == "verify" and not self.db_ca_bundle:
            raise ValueError(
                "DB_TLS=verify checks the server against a CA bundle: set DB_CA_BUNDLE (certifi or a PEM path)"
            )
        if self.kafka_auth == "iam" and not self.aws_region:
            raise ValueError("KAFKA_AUTH=iam signs its token for a region: set AWS_REGION")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _Variables(settings_cls), _Secrets(settings_cls), _Tunables(settings_cls)


ENV = {name: name.upper() for name in Settings.model_fields}  # setting -> its environment variable
SSM_TUNABLES = frozenset(name for name, f in Settings.model_fields.items() if f.json_schema_extra == TUNABLE)

# the environment build_settings reads (None outside it: a Settings(...) of a test reads no source)
_environment: ContextVar[Mapping[str, str] | None] = ContextVar("environment", default=None)


class _Source(PydanticBaseSettingsSource):
    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        env = _environment.get()
        return {} if env is None else self.read(env)

    def read(self, env: Mapping[str, str]) -> dict[str, Any]:
        raise NotImplementedError


class _Variables(_Source):
    """Environment variables, by each setting's upper-case name; an empty one counts as unset."""

    def read(self, env: Mapping[str, str]) -> dict[str, Any]:
        return {name: env[var] for name, var in ENV.items() if env.get(var) not in (None, "")}


class _Secrets(_Source):
    """The DB credentials (DB_SECRET_ARN) and the Redis AUTH token (REDIS_AUTH_SECRET_ARN) from Secrets Manager."""

    def read(self, env: Mapping[str, str]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        max_age_s = int(env.get("SECRETS_MAX_AGE_S") or Settings.model_fields["secrets_max_age_s"].default)
        if env.get("DB_SECRET_ARN"):
            values.update(db_credentials(secret_value(env["DB_SECRET_ARN"], max_age_s), env))
        if env.get("REDIS_AUTH_SECRET_ARN"):
            values["redis_password"] = secret_value(env["REDIS_AUTH_SECRET_ARN"], max_age_s)
        return values


class _Tunables(_Source):
    """The tunables under SSM_PARAMETER_PATH, e.g. /dev/hotledger/reconcile_age_s = 120 (Powertools parameters)."""

    def read(self, env: Mapping[str, str]) -> dict[str, Any]:
        path = env.get("SSM_PARAMETER_PATH")
        if not path:
            return {}
        from aws_lambda_powertools.utilities import parameters

        found = parameters.get_parameters(path, recursive=False, max_age=0)
        return {name: value for name, value in found.items() if name in SSM_TUNABLES}


def secret_value(secret_id: str, max_age_s: int, fresh: bool = False) -> str:
    """A Secrets Manager value through Powertools parameters: cached max_age_s per container, `fresh` reads it again."""
    from aws_lambda_powertools.utilities import parameters

    return parameters.get_secret(secret_id, max_age=max_age_s, force_fetch=fresh)


def db_credentials(secret: str, env: Mapping[str, str]) -> dict[str, Any]:
    """Settings from the DB secret (username, password; host, port, dbname unless set by their variables)."""
    value = json.loads(secret)
    values = {"db_user": value["username"], "db_password": value["password"]}
    for key, name in (("host", "db_host"), ("port", "db_port"), ("dbname", "db_name")):
        if key in value and not env.get(ENV[name]):
            values[name] = value[key]
    return values


def with_values(cfg: Settings, **values: Any) -> Settings:
    """cfg with these settings changed, checked as any settings are."""
    return Settings(**{**cfg.model_dump(), **values})


def build_settings(env: Mapping[str, str] | None = None) -> Settings:
    """The settings from the sources (env: these variables instead of the process's). A value out of its type or range
    raises ValueError naming its variable."""
    token = _environment.set(os.environ if env is None else env)
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"{ENV.get(str(e['loc'][0]), 'settings') if e['loc'] else 'settings'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(problems) from None
    finally:
        _environment.reset(token)


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    """Process-wide settings, read once per Lambda container."""
    return build_settings()
