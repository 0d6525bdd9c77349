"""Test wiring. tests/unit needs no server at all. Every other folder gets real Redis, MariaDB and a
Kafka-protocol broker (started when absent): a private Redis process, DB schema and topic per run, so
concurrent runs never share state. HOTLEDGER_TEST_REDIS=cluster makes the run's Redis a private 3-master Redis
Cluster with one replica each (`make test-cluster`); tests marked single_redis stop "the" Redis process and are
left out of that run."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import lua_replies
import pytest

from infra.event_keys import new_keyring

RUN_ID = uuid.uuid4().hex[:8]
ON_CLUSTER = os.environ.get("HOTLEDGER_TEST_REDIS", "single") == "cluster"
os.environ.setdefault("DB_HOST", "127.0.0.1")
os.environ.setdefault("DB_PORT", "3306")
os.environ.setdefault("DB_USER", "root")
os.environ.setdefault("DB_PASSWORD", "")
os.environ["DB_NAME"] = f"hotledger_test_{RUN_ID}"
os.environ.setdefault("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
os.environ["KAFKA_TOPIC"] = f"hotledger.test.{RUN_ID}"
os.environ.setdefault("PUBLISH_TIMEOUT_S", "3")
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "HotledgerTest")
os.environ.setdefault("LOG_LEVEL", "WARNING")
os.environ.setdefault(
    "EVENT_KEYS", json.dumps(new_keyring())
)  # the run's keyring: the service signs, the writer checks

TESTS = Path(__file__).resolve().parent
UNIT = TESTS / "unit"
# what each folder needs: unit nothing, integration the servers, e2e and faults real processes for minutes
FOLDER_MARKS = {"integration": ("integration",), "e2e": ("slow",), "faults": ("slow", "faults")}


lua_replies.record()


def pytest_sessionfinish(session, exitstatus):
    """After a whole default run on one Redis: every reply a script's header states was produced by a test (after any
    run, of the scripts LUA_REPLIES_CHECK names: tests/lua_replies.py)."""
    if exitstatus != 0 or ON_CLUSTER:
        return
    scripts = None if lua_replies.whole_default_run(session.config) else lua_replies.checked_scripts()
    if scripts is None or scripts:
        unproduced = lua_replies.missing(scripts)
        if unproduced:
            print("\nLua replies stated in their script's header that no test produced:", sorted(unproduced))
            session.exitstatus = 1


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = Path(str(item.fspath)).relative_to(TESTS).parts[0]
        for mark in FOLDER_MARKS.get(folder, ()):
            item.add_marker(getattr(pytest.mark, mark))


@pytest.fixture(autouse=True)
def _servers_outside_unit(request):
    """Everything outside tests/unit runs against the real servers."""
    if UNIT not in Path(str(request.node.fspath)).parents:
        request.getfixturevalue("backing_services")


@pytest.fixture(scope="session")
def backing_services():
    """Start the run's Redis and whatever else is not running; create the run's schema and topic; drop them after."""
    import pymysql

    from hotledger import runtime
    from infra import services
    from infra.migrate import migrate

    if ON_CLUSTER:
        redis_server = services.RedisCluster(
            services.free_cluster_ports(6), services.STATE / f"test-redis-cluster-{RUN_ID}"
        ).start()
    else:
        redis_server = services.RedisServer(services.free_port(), services.STATE / f"test-redis-{RUN_ID}").start()
    os.environ["REDIS_URL"] = redis_server.url
    runtime.reset()  # settings read before this point would name another Redis
    cfg = runtime.settings()
    services.ensure_mariadb(cfg.db_host, cfg.db_port, cfg.db_user, cfg.db_password)
    host, port = cfg.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    services.ensure_broker(host, int(port))
    services.ensure_topic(cfg.kafka_bootstrap, cfg.kafka_topic, 4)
    migrate(cfg.db_host, cfg.db_port, cfg.db_user, cfg.db_password, cfg.db_name)
    yield redis_server
    conn = pymysql.connect(host=cfg.db_host, port=cfg.db_port, user=cfg.db_user, password=cfg.db_password)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{cfg.db_name}`")
    conn.close()
    redis_server.stop()
    shutil.rmtree(redis_server.root, ignore_errors=True)


@pytest.fixture(scope="session")
def settings(backing_services):
    from hotledger.config import settings as current

    return current()


@pytest.fixture(scope="session")
def redis_server(backing_services):
    """The run's private Redis process (tests may pause it; none may leave it stopped). Such tests are marked
    single_redis: a cluster has no one process to stop."""
    if ON_CLUSTER:
        pytest.fail("this test stops the one Redis process: mark it single_redis (left out of the cluster run)")
    return backing_services


@pytest.fixture(scope="session")
def redis_client(settings):
    """A client of the run's Redis, a cluster client on a cluster (FLUSHALL then empties every master)."""
    from hotledger.dal.redis_store import connect

    return connect(settings)


@pytest.fixture
def sql(settings):
    """Run one autocommit statement, return all rows."""
    import pymysql

    conn = pymysql.connect(
        host=settings.db_host,
        port=settings.db_port,
        user=settings.db_user,
        password=settings.db_password,
        database=settings.db_name,
        autocommit=True,
    )

    def run(statement: str, args=None):
        with conn.cursor() as cur:
            cur.execute(statement, args)
            return cur.fetchall()

    yield run
    conn.close()


@pytest.fixture(scope="session")
def api(backing_services):
    from helpers import Api

    return Api()


@pytest.fixture
def own_topic(settings, monkeypatch):
    """A topic of the test's own: its log holds only what the test published (the writer's watermark and a
    rebuild's end of the log are about it alone). Services are rebuilt around it, and again after the test."""
    from hotledger import runtime
    from infra import services

    topic = f"{settings.kafka_topic}.{uuid.uuid4().hex[:8]}"
    services.ensure_topic(settings.kafka_bootstrap, topic, 4)
    monkeypatch.setenv("KAFKA_TOPIC", topic)
    runtime.reset()
    yield topic
    monkeypatch.setenv("KAFKA_TOPIC", settings.kafka_topic)
    runtime.reset()


@pytest.fixture
def local_hooks(monkeypatch):
    """Local webhook receivers (helpers.Receiver) the webhooks may deliver to: local_hooks(status) starts one."""
    from helpers import Receiver
    from hotledger.webhooks.feature import webhooks

    monkeypatch.setattr(webhooks(), "allow_local", True)
    receivers = []
    yield lambda status=204, hold=None: receivers.append(Receiver(status, hold)) or receivers[-1]
    for r in receivers:
        r.close()
        # its endpoints go too: an endpoint left pointing at a closed port would be tried by every later test's sends
        for endpoint in webhooks().endpoints():
            if endpoint.url == r.url:
                webhooks().delete(endpoint.endpoint_id)
