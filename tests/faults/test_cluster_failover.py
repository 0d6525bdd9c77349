"""A Redis Cluster master fails mid-traffic, after its replica fell behind: the failover loses acknowledged writes.

A private 3-master Redis Cluster (one replica each), MariaDB and broker. Clients deduct without pause over accounts
spread on every master. The replica of one master is paused (SIGSTOP) until the master drops it, so the master
acknowledges charges it never replicates; the master is SIGKILLed, the replica resumed and promoted (CLUSTER FAILOVER TAKEOVER): its accounts are
now behind the DB (the lost charges reach the DB through the broker). The reconciler detects it and corrects the
cache; afterwards every acknowledged deduct is in the DB exactly once and Redis == DB for every account."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import redis

from faults.test_faults import ChaosClients, Stack, _account, acknowledged_deducts_in_the_db_exactly_once
from helpers import LocalService
from hotledger.config import Settings
from hotledger.dal import redis_store
from infra import services


@pytest.fixture
def cluster_stack(tmp_path):
    cluster = services.RedisCluster(services.free_cluster_ports(6), tmp_path / "redis-cluster")
    stack = Stack(tmp_path, cluster).start()
    yield stack
    stack.stop()


def test_a_master_killed_after_its_replica_fell_behind_is_failed_over_and_repaired(cluster_stack):
    stack, cluster = cluster_stack, cluster_stack.redis
    svc = stack.service("failover").start()
    try:
        accounts = [_account(svc, "100000.00") for _ in range(9)]
        masters = {cluster.master_of(f"user:balance:{{{user_id}}}").port for user_id in accounts}
        assert len(masters) == 3, masters  # the traffic reaches every master
        victim = cluster.master_of(f"user:balance:{{{accounts[0]}}}")
        replica = cluster.replica_of(victim)
        with ChaosClients(svc, accounts, threads=3) as clients:
            time.sleep(3)
            victim.client().config_set("repl-timeout", 1)  # drops a silent replica after 1 s, not 60
            os.kill(replica.proc.pid, signal.SIGSTOP)
            LocalService.wait_until(
                lambda: victim.client().info("replication")["connected_slaves"] == 0,
                30,
                "the master to drop its paused replica",
                0.2,
            )
            time.sleep(2)  # the master goes on acknowledging charges its replica never receives
            acked_before_kill = len(clients.acked)
            victim.kill()
            os.kill(replica.proc.pid, signal.SIGCONT)
            replica.client().execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
            LocalService.wait_until(lambda: cluster.role(replica) == "master", 30, "the replica to take over", 0.2)
            time.sleep(4)
            victim.start()  # back empty, as the new master's replica
            time.sleep(2)
        assert acked_before_kill > 0 and len(clients.acked) > acked_before_kill, (
            clients.answers
        )  # traffic went on after
        assert set(clients.answers) <= {(200, None), (503, "SERVICE_UNAVAILABLE"), (503, "OUTCOME_UNKNOWN")}, (
            clients.answers
        )
        cluster.wait_ok()
        acknowledged_deducts_in_the_db_exactly_once(stack, svc, clients, accounts, 10_000_000)
        # the loss was seen and repaired by the reconciler (the cache behind the DB), not by luck
        assert re.search(r'"CacheCorrected":\[?[1-9]', svc.log_text()), "no cache correction in the service log"
    finally:
        svc.stop()


@pytest.fixture
def cluster(tmp_path):
    cluster = services.RedisCluster(services.free_cluster_ports(6), tmp_path / "redis-cluster").start()
    yield cluster
    cluster.stop()


def test_script_pipelines_recover_when_the_default_and_startup_node_dies(cluster, tmp_path):
    """The master of slot 0 is the node REDIS_URL names and the first primary of the client's discovery (its default
    node). Pipelined scripts (the writer's settle, the reconciler's, the drainers') route by their keys' slot computed
    on the client: once its replica has taken over they run again, with no restart and nothing else refreshing the
    client. Before, every pipeline asked the dead default node for its scripts' keys (COMMAND GETKEYS) for good."""
    seed = cluster.nodes[0]
    assert cluster.master_of("{3560}") is seed  # "{3560}" hashes to slot 0
    scripts = tmp_path / "lua"
    scripts.mkdir()
    (scripts / "count.lua").write_text("return redis.call('INCR', KEYS[1])")
    cfg = Settings(redis_url=f"redis+cluster://127.0.0.1:{seed.port}")
    lua = redis_store.Lua(redis_store.connect(cfg), str(scripts))
    assert lua.client.get_default_node().port == seed.port
    keys = [f"count:{{{n}}}" for n in range(12)]  # every master's slots
    assert {cluster.master_of(key).port for key in keys} == set(cluster.master_ports())

    def counted():
        pipe = lua.pipeline()
        for key in keys:
            lua.run("count", [key], [], client=pipe)
        return pipe.execute()

    assert counted() == [1] * len(keys)
    replica = cluster.replica_of(seed)
    seed.kill()
    LocalService.wait_until(lambda: cluster.role(replica) == "master", 60, "the replica to take over", 0.2)
    recovered_after = time.monotonic() + 10  # a few failed pipelines make the client discover the cluster again
    while True:
        try:
            replies = counted()
            break
        except redis.RedisError:
            assert time.monotonic() < recovered_after, "pipelines still fail after the failover"
            time.sleep(0.5)
    assert all(isinstance(reply, int) and reply >= 1 for reply in replies) and len(replies) == len(keys), replies
    # the configured address stays among the nodes a topology refresh starts from, beside the discovered ones, though
    # the cluster no longer announces it (so does an ElastiCache configuration endpoint's name, which outlives any node)
    assert f"127.0.0.1:{seed.port}" in lua.client.nodes_manager.startup_nodes
    assert len(lua.client.nodes_manager.startup_nodes) > 1


SCHEDULED_RUN = """
import json
from delay_drainer.app import handler
from infra.localrt.events import LambdaContext, scheduled
print(json.dumps(handler(scheduled(), LambdaContext("drainer", timeout_s=3))))
"""


def test_a_fresh_process_starts_after_the_default_node_is_lost_for_good(cluster):
    """Issue 31, hole 9: REDIS_URL names every seed node (as `make up-cluster` gives them), and a process started after
    the first one's permanent loss (a replaced node comes back at a new address) finds the cluster from another. Before,
    every scheduled run failed: "Redis Cluster cannot be connected ... 127.0.0.1:<the lost node>"."""
    seed = cluster.nodes[0]
    assert cluster.url.split("://", 1)[1].split(",")[0] == f"127.0.0.1:{seed.port}"  # the lost node is named first
    replica = cluster.replica_of(seed)
    seed.kill()  # never started again
    LocalService.wait_until(lambda: cluster.role(replica) == "master", 60, "the replica to take over", 0.2)
    cluster.wait_ok()
    run = subprocess.run(
        [sys.executable, "-c", SCHEDULED_RUN],
        env={**os.environ, "REDIS_URL": cluster.url, "PYTHONPATH": "functions:."},
        cwd=services.REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["handled"] == 0
