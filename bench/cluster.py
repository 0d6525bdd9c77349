"""Redis Cluster figures (issue 12), side by side with the single Redis of the same bench run:

- `cluster_getkeys_per_script_call`: the key lookups a pipelined script costs the client (0 since issue 18);
- Redis CPU per call of each hot-path script (usec_per_call of EVALSHA from INFO commandstats, summed over the
  masters): EVALSHA is one stat for every script, so each script's workload runs alone and the delta is read.

Called by bench/run.py (`make bench`).
"""

from __future__ import annotations

import time
from pathlib import Path

import redis
import scripts

from infra import services

REPO = Path(__file__).resolve().parents[1]
SCRIPT_STATS = ("cmdstat_evalsha", "cmdstat_eval")
BATCH = 200


def start(root: Path) -> services.RedisCluster:
    """3 masters and no replicas: on 2 cores a replica only takes CPU from the masters the figures are about."""
    return services.RedisCluster(services.free_cluster_ports(3), root, replicas=0).start()


def _masters(target) -> list[redis.Redis]:
    if isinstance(target, services.RedisCluster):
        return [target.node(port).client() for port in target.master_ports()]
    return [redis.Redis(host=target.host, port=target.port)]


def _script_stats(masters: list[redis.Redis]) -> list[tuple[int, int]]:
    """(calls, usec) of script runs per master."""
    stats = []
    for master in masters:
        info = master.info("commandstats")
        stats.append(
            (
                sum(info.get(s, {}).get("calls", 0) for s in SCRIPT_STATS),
                sum(info.get(s, {}).get("usec", 0) for s in SCRIPT_STATS),
            )
        )
    return stats


def _run(lua, calls: list[tuple[str, list[str], list]]) -> None:
    for start_at in range(0, len(calls), BATCH):
        pipe = lua.pipeline()
        for name, keys, args in calls[start_at : start_at + BATCH]:
            lua.run(name, keys, args, client=pipe)
        pipe.execute()


# each workload: setup(client), then the measured script calls; every entity its own hash tag, so its own slot ------
def deducts(client, entities: int, calls: int) -> list[tuple[str, list[str], list]]:
    """ledger_apply: an ASYNC deduct of 0.01 from one of `entities` accounts (loaded with ledger_load first)."""
    from hotledger.dal.redis_store import Lua

    uids = [900_000_000 + i for i in range(entities)]
    lua = Lua(client, str(REPO / "layers/lua"))
    _run(lua, [scripts.load_call(lua, uid, 10**15) for uid in uids])

    def call(n: int) -> tuple[str, list[str], list]:
        return scripts.deduct_call(lua, uids[n % entities], int(f"9{n}"))

    return [call(n) for n in range(calls)]


def voucher_orders(client, entities: int, calls: int) -> list[tuple[str, list[str], list]]:
    """voucher_order: a new buyer takes a unit of one of `entities` vouchers (a stock that never runs out)."""
    from hotledger import keys

    vids = [910_000_000 + i for i in range(entities)]
    for vid in vids:
        client.hset(
            keys.voucher(vid),
            mapping={
                "stock": 10**12,
                "begin": 0,
                "end": 2**50,
                "limit": 1,
                "epoch": "bench",
                "hold_until": 0,
                "db_version": 0,
            },
        )
    now = int(time.time() * 1000)

    def call(n: int) -> tuple[str, list[str], list]:
        vid = vids[n % entities]
        return (
            "voucher_order",
            [
                keys.voucher(vid),
                keys.voucher_buyers(vid),
                keys.voucher_pending(vid),
                keys.voucher_stream(vid),
                keys.voucher_away(vid),
            ],
            [vid, 1 + n, 10**12 + n, now, "", 0, 1],
        )

    return [call(n) for n in range(calls)]


def grabs(client, entities: int, calls: int) -> list[tuple[str, list[str], list]]:
    """redpacket_grab: a new user grabs from one of `entities` packets, each holding enough items for every grab."""
    from hotledger import keys

    pids = [920_000_000 + i for i in range(entities)]
    for pid in pids:
        client.hset(keys.packet(pid), mapping={"state": "OPEN", "expires_at": 2**50, "hold_until": 0})
        client.rpush(keys.packet_unclaimed(pid), *(f"{10**10 + i};1" for i in range(calls // entities + 1)))
    now = int(time.time() * 1000)

    def call(n: int) -> tuple[str, list[str], list]:
        pid = pids[n % entities]
        return (
            "redpacket_grab",
            [
                keys.packet(pid),
                keys.packet_unclaimed(pid),
                keys.packet_grabbers(pid),
                keys.packet_pending(pid),
                keys.packet_stream(pid),
            ],
            [pid, 1 + n, now, 10**12 + n, ""],
        )

    return [call(n) for n in range(calls)]


WORKLOADS = {"ledger_apply": deducts, "voucher_order": voucher_orders, "redpacket_grab": grabs}


def _getkeys(masters: list[redis.Redis]) -> int:
    """COMMAND GETKEYS calls the masters served: what a cluster pipeline sends to learn a script's keys."""
    return sum(m.info("commandstats").get("cmdstat_command|getkeys", {}).get("calls", 0) for m in masters)


def script_costs(target, client, entities: int, calls: int) -> tuple[dict, list[int], int]:
    """usec_per_call of each workload's script on `target` (a RedisServer or RedisCluster, `client` its client), the
    script calls each master ran over all workloads, and the COMMAND GETKEYS round trips the client made meanwhile."""
    from hotledger.dal.redis_store import Lua, script_text

    lua, masters = Lua(client, str(REPO / "layers/lua")), _masters(target)
    costs, per_master, getkeys_before = {}, [0] * len(masters), _getkeys(masters)
    for script, workload in WORKLOADS.items():
        measured = workload(client, entities, calls)
        client.script_load(script_text(REPO / f"layers/lua/{script}.lua"))  # every master: no NOSCRIPT replies counted
        before = _script_stats(masters)
        _run(lua, measured)
        after = _script_stats(masters)
        deltas = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=False)]
        ran = sum(d[0] for d in deltas)
        assert ran == calls, f"{script}: {ran} script calls counted for {calls} sent"
        costs[script] = round(sum(d[1] for d in deltas) / ran, 2)
        per_master = [total + d[0] for total, d in zip(per_master, deltas, strict=False)]
    return costs, per_master, _getkeys(masters) - getkeys_before


def figures(single: services.RedisServer, cluster: services.RedisCluster, size) -> dict:
    """Per-script Redis CPU on the single Redis and on the cluster, and how the keys spread over the masters."""
    entities, calls = 60, size.pick(20_000, 5_000, 500)
    single_costs, _, _ = script_costs(single, single.client(), entities, calls)
    cluster_costs, per_master, getkeys = script_costs(cluster, cluster.client(), entities, calls)
    # the keys' spread over the masters (CRC16 of fixed ids) is not a figure: it cannot come out otherwise
    # a pipelined script's slot is computed on the client (issue 18): no key lookup on the hot path
    result = {"cluster_getkeys_per_script_call": round(getkeys / (calls * len(WORKLOADS)), 3)}
    for script in WORKLOADS:
        result[f"{script}_redis_usec_per_call_single"] = single_costs[script]
        result[f"{script}_redis_usec_per_call_cluster"] = cluster_costs[script]
        result[f"{script}_cluster_vs_single_cpu_ratio"] = round(cluster_costs[script] / single_costs[script], 2)
    return result
