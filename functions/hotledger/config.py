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
    lock_ttl_ms: int = 5000
    lock_wait_ms: int = 3000
    lua_dir: str = str(_REPO_LUA_DIR)


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
    "lock_ttl_ms": "LOCK_TTL_MS",
    "lock_wait_ms": "LOCK_WAIT_MS",
    "lua_dir": "LUA_DIR",
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

    tunable = {"publish_timeout_s", "entry_ttl_s", "idempotency_ttl_s", "reconcile_age_s", "lock_ttl_ms", "lock_wait_ms"}
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
    return replace(Settings(), **merged)


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    """Process-wide settings, read once per Lambda container."""
    return build_settings()
