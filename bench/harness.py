"""What every bench stage shares, and nothing of any stage: the run's servers (environment, private_cluster) and the
figures' targets. run.py and each stage run on their own import this; no stage imports run.py."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import uuid
from pathlib import Path

from infra import services
from infra.event_keys import local_keyring
from infra.migrate import migrate

LAG_RATES = (200, 500, 1000)
SIZES = ("full", "quick", "smoke")


@dataclasses.dataclass(frozen=True)
class Size:
    """How big a run's stages are: "full" (make bench), "quick" (QUICK=1: a few minutes in all) or "smoke" (make
    bench-smoke, in make test: each stage once at a tiny size, seconds each, its figures judged by nothing)."""

    name: str = "full"

    def __post_init__(self) -> None:
        if self.name not in SIZES:
            raise ValueError(f"size {self.name!r} is not one of {SIZES}")

    @classmethod
    def of(cls, quick: bool = False, smoke: bool = False) -> Size:
        return cls("smoke" if smoke else "quick" if quick else "full")

    def pick(self, full, quick, smoke):
        """This size's value of the three."""
        return {"full": full, "quick": quick, "smoke": smoke}[self.name]

    @property
    def smoke(self) -> bool:
        return self.name == "smoke"


TARGETS = {
    "async_vs_sync_hot_ratio": (">=", 5),
    "sync_vs_lean_ratio": (">=", 0.8),  # issue 33 goal 3: SYNC at the database's speed
    "hot_account_failed_requests": ("<=", 0),
    "writer_rows_per_s": (">=", 50000),
    "writer_not_persisted": ("<=", 0),
    "writer_left_pending": ("<=", 0),
    **{f"ack_to_commit_lag_p99_ms_at_{r}_per_s": ("<=", 300) for r in LAG_RATES},
    **{f"lag_not_persisted_at_{r}_per_s": ("<=", 0) for r in LAG_RATES},
    "redpacket_grabs_per_s": (">=", 40000),
    "seckill_oversell": ("<=", 0),
    "seckill_unsold": ("<=", 0),
    "seckill_attempts_refused": ("<=", 0),
    "sharded_voucher_oversell": ("<=", 0),
    "cluster_sharded_voucher_oversell": ("<=", 0),
    "delay_remove_p99_ms_100k": ("<=", 0.5),
    "handler_vs_floor_cpu_ratio": ("<=", 1.5),
    "cluster_getkeys_per_script_call": ("<=", 0),
    # issue 20: holds, history and balances at depth, what holds cost every deduct
    "hold_authorize_lua_p99_ms_1000_holds": ("<=", 0.3),
    "history_page_p99_ms_1m_entries": ("<=", 50),
    "balance_at_p99_ms_1m_entries": ("<=", 20),
    "deduct_script_vs_before_holds_ratio": (">=", 0.95),
    # issue 21: webhooks from the durable log
    "webhook_delivery_lag_p99_ms": ("<=", 2000),
    "webhook_not_delivered": ("<=", 0),
    # issue 32 item 11: a look at what is due costs the same whatever the backlog
    "webhook_due_backlog_ratio": ("<=", 1.5),
    # issue 32: a 1M backlog over 10 endpoints drains at half the bare POST rate; a blackholed endpoint costs the others
    # no lag
    "webhook_1m_backlog_drain_ratio": (">=", 0.5),
    "webhook_blackhole_lag_ratio": ("<=", 1.2),
    # issue 33 goal 2: one hot account's ceiling, server side, Redis against the database (bench/ceiling.py)
    "hot_account_ceiling_ratio": (">=", 20),
    # issue 33 goal 4: a deduct's request-driven cost behind the default front door
    "cost_per_million_deduct_usd": ("<=", 2.0),
    # issue 33 goal 5: the writer keeps up, its rows/s through the broker over the API's ASYNC deducts/s (same run)
    "writer_vs_api_deduct_ratio": (">=", 20),
    # issue 33 goal 6: the handler's instructions per deduct over the floor's
    "handler_vs_floor_instructions_ratio": ("<=", 2.0),
}


@contextlib.contextmanager
def private_cluster(state: Path):
    """A private 3-master Redis Cluster beside the run's Redis, stopped and removed after."""
    import cluster

    redis_cluster = cluster.start(state / "redis-cluster")
    try:
        yield redis_cluster
    finally:
        redis_cluster.stop()
        shutil.rmtree(state / "redis-cluster", ignore_errors=True)


@contextlib.contextmanager
def environment(name: str = "hotledger_bench"):
    """The run's servers: a private Redis, a schema of its own (`<name>_<run id>`: runs beside each other never drop
    each other's), a fresh topic of the local partitions (MariaDB and the broker are started when absent). Yields
    (settings, the Redis server, the run's state dir); stops the Redis and drops the schema after."""
    run_id = uuid.uuid4().hex[:8]
    schema = f"{name}_{run_id}"
    state = services.STATE / f"bench-{run_id}"
    redis_server = services.RedisServer(services.free_port(), state / "redis").start()
    os.environ.update(
        {
            "REDIS_URL": redis_server.url,
            "DB_NAME": schema,
            "KAFKA_TOPIC": f"hotledger.bench.{run_id}",
            "LOG_LEVEL": "WARNING",
            "POWERTOOLS_METRICS_NAMESPACE": "HotledgerBench",
            # the CPU benchmarks charge hot accounts with no writer running: no pending bound for them
            "MAX_PENDING_ENTRIES": "0",
        }
    )
    # the service signs every event it publishes: the dev keyring, as the local runtime uses it
    if not (os.environ.get("EVENT_KEYS") or os.environ.get("EVENT_KEYS_SECRET_ARN")):
        os.environ["EVENT_KEYS"] = local_keyring()
    from hotledger.config import settings

    cfg = settings()
    services.ensure_mariadb(cfg.db_host, cfg.db_port, cfg.db_user, cfg.db_password)
    host, port = cfg.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    services.ensure_broker(host, int(port))
    services.ensure_topic(cfg.kafka_bootstrap, cfg.kafka_topic, services.LOCAL_PARTITIONS)
    migrate(cfg.db_host, cfg.db_port, cfg.db_user, cfg.db_password, schema)
    try:
        yield cfg, redis_server, state
    finally:
        redis_server.stop()
        shutil.rmtree(state / "redis", ignore_errors=True)
        import pymysql

        conn = pymysql.connect(host=cfg.db_host, port=cfg.db_port, user=cfg.db_user, password=cfg.db_password)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{schema}`")
        conn.close()
