"""Test wiring: real Redis, MariaDB and a Kafka-protocol broker (started when absent), an isolated
Redis database, DB schema and topic per run, and helpers to drive the handlers with real event shapes."""
from __future__ import annotations

import json
import os
import shutil
import uuid

RUN_ID = uuid.uuid4().hex[:8]
os.environ.setdefault("DB_HOST", "127.0.0.1")
os.environ.setdefault("DB_PORT", "3306")
os.environ.setdefault("DB_USER", "root")
os.environ.setdefault("DB_PASSWORD", "")
os.environ["DB_NAME"] = f"hotledger_test_{RUN_ID}"  # concurrent runs never share a schema
os.environ.setdefault("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
os.environ["KAFKA_TOPIC"] = f"hotledger.test.{RUN_ID}"
os.environ.setdefault("PUBLISH_TIMEOUT_S", "3")
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "HotledgerTest")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import pymysql  # noqa: E402
import pytest  # noqa: E402
import redis  # noqa: E402

from infra import services  # noqa: E402

# a private Redis per run (its own port, no persistence): concurrent runs never share keys
_REDIS = services.RedisServer(services.free_port(), services.STATE / f"test-redis-{RUN_ID}").start()
os.environ["REDIS_URL"] = _REDIS.url
from infra.localrt import events  # noqa: E402
from infra.migrate import migrate  # noqa: E402


@pytest.fixture(scope="session")
def settings():
    from hotledger.config import settings as current

    return current()


@pytest.fixture(scope="session", autouse=True)
def backing_services(settings):
    """Start whatever is not running, create the run's schema and topic; drop them afterwards."""
    services.ensure_mariadb(settings.db_host, settings.db_port, settings.db_user, settings.db_password)
    host, port = settings.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    services.ensure_broker(host, int(port))
    services.ensure_topic(settings.kafka_bootstrap, settings.kafka_topic, 4)
    migrate(settings.db_host, settings.db_port, settings.db_user, settings.db_password, settings.db_name)
    yield
    conn = pymysql.connect(host=settings.db_host, port=settings.db_port, user=settings.db_user, password=settings.db_password)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{settings.db_name}`")
    conn.close()
    _REDIS.stop()
    shutil.rmtree(_REDIS.root, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> services.RedisServer:
    """The run's private Redis process (tests may pause it; none may leave it stopped)."""
    return _REDIS


@pytest.fixture(scope="session")
def redis_client(settings):
    return redis.Redis.from_url(settings.redis_url)


@pytest.fixture
def sql(settings):
    """Run one autocommit statement, return all rows."""
    conn = pymysql.connect(host=settings.db_host, port=settings.db_port, user=settings.db_user,
                           password=settings.db_password, database=settings.db_name, autocommit=True)

    def run(statement: str, args=None):
        with conn.cursor() as cur:
            cur.execute(statement, args)
            return cur.fetchall()

    yield run
    conn.close()


class Api:
    """Calls the API function's handler with API Gateway REST proxy events."""

    def __init__(self):
        from api.app import handler

        self.handler = handler

    def __call__(self, method: str, path: str, body=None, headers: dict | None = None, raw: str | None = None):
        text = raw if raw is not None else (json.dumps(body) if body is not None else None)
        path, _, query = path.partition("?")
        response = self.handler(events.api_gateway_proxy(method, path, text, headers, query), events.LambdaContext("ApiFunction"))
        return response["statusCode"], events.json_body(response) if response["body"].startswith(("{", "[")) else response["body"]

    def account(self, name: str | None = None, balance: str | None = None, **fields) -> int:
        status, body = self("POST", "/accounts", {"user_name": name or f"u-{uuid.uuid4().hex[:12]}", **fields})
        assert status == 201, body
        user_id = body["user_id"]
        if balance:
            status, body = self("POST", f"/accounts/{user_id}/recharge", {"amount": balance})
            assert status == 200, body
        return user_id


@pytest.fixture(scope="session")
def api() -> Api:
    return Api()


def invoke_writer(records: list[tuple[int, int, bytes | None, bytes | None]], topic: str | None = None) -> dict:
    from writer.app import handler

    topic = topic or os.environ["KAFKA_TOPIC"]
    event = events.msk(topic, [(p, o, k, v, 1_700_000_000_000) for p, o, k, v in records])
    return handler(event, events.LambdaContext("WriterFunction"))
