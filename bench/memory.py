"""Redis memory per entity: INFO used_memory before and after making `n` of each (the service's own scripts, pipelined,
on a private empty Redis of the run), over n: what an ElastiCache node's memory holds of each (entities per GiB,
dataset only: no replication buffers, fragmentation or reserved memory). Entities:

- account: a cached account (ledger_load: balance hash, held hash);
- pending entry: an ASYNC deduct waiting for the writer (entry string with its TTL, pending-set member);
- settled entry: what an entry leaves once the writer settled it, kept for resend evidence (SETTLED_TTL_S);
- idempotency record: what a charge with an Idempotency-Key adds to one without;
- hold: what a recharge's held credit adds to a deduct's entry (ledger_post releases it once durable);
- delay element: an element of a delay queue (delay_offer);
- voucher buyer: a new buyer's order of a hot voucher (buyers hash field + pending order);
- red-packet item: an unclaimed item of a packet's list.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import scripts
import stats

REPO = Path(__file__).resolve().parents[1]
ACCOUNTS = 1000  # the accounts the entries are spread over


def _used(client) -> int:
    return int(client.info("memory")["used_memory"])


def _run(lua, client, calls) -> None:
    pipe = client.pipeline(transaction=False)
    for n, (name, keys, args) in enumerate(calls, 1):
        lua.run(name, keys, args, client=pipe)
        if n % 1000 == 0:
            pipe.execute()
    pipe.execute()


def _load(lua, client, uids) -> None:
    """Cache each account as a load from the DB does (LedgerStore.cache_account's call, bench/scripts.py)."""
    _run(lua, client, [scripts.load_call(lua, u, 10**15) for u in uids])


def _apply(lua, uid: int, n: int, kind: str = "D", idem: str = "") -> tuple:
    """An ASYNC charge without a reply kept for it (no key) or with a client key checked against the DB, as
    LedgerStore.apply sends it."""
    charge = scripts.deduct(uid, n)
    if kind != "D" or idem:
        charge = dataclasses.replace(
            charge, kind=kind, idem_key=idem or None, fingerprint="f" * 64 if idem else "", key_checked=bool(idem)
        )
    return scripts.recorded(lua, "apply", charge)


def figures(client, n: int) -> dict:
    """bytes per entity for each kind, over `n` of each, on `client` (an empty Redis of its own)."""
    from hotledger import keys
    from hotledger.dal.redis_store import Lua

    lua = Lua(client, str(REPO / "layers/lua"))
    client.flushall()
    found: dict[str, float] = {}

    def measure(name: str, make) -> float:
        before = _used(client)
        make()
        found[name] = round((_used(client) - before) / n, 1)
        return found[name]

    measure("account", lambda: _load(lua, client, range(1, n + 1)))
    uids = [10_000_000 + i for i in range(ACCOUNTS)]
    _load(lua, client, uids)
    before_pending = _used(client)
    entry_ids = [(uids[i % ACCOUNTS], 10**12 + i) for i in range(n)]
    measure("pending_entry", lambda: _run(lua, client, [_apply(lua, u, e) for u, e in entry_ids]))

    def settle() -> None:
        by_account: dict[int, list[int]] = {}
        for u, e in entry_ids:
            by_account.setdefault(u, []).append(e)
        calls = []
        for u, ids in by_account.items():
            for i in range(0, len(ids), 200):
                part = ids[i : i + 200]
                calls.append(
                    (
                        "ledger_settle",
                        [
                            f"user:order:consistency:{{{u}}}",
                            f"user:balance:{{{u}}}",
                            f"user:held:{{{u}}}",
                            f"user:holds:{{{u}}}",
                            *(f"user:order:{{{u}}}:{e}" for e in part),
                        ],
                        [",".join(["bench"] * len(part))],
                    )
                )
        _run(lua, client, calls)

    settle()
    found["settled_entry"] = round((_used(client) - before_pending) / n, 1)
    keyed = [20_000_000 + i for i in range(ACCOUNTS)]
    _load(lua, client, keyed)
    with_key = measure(
        "idempotency_record",
        lambda: _run(
            lua, client, [_apply(lua, keyed[i % ACCOUNTS], 2 * 10**12 + i, idem=f"c:bench-key-{i}") for i in range(n)]
        ),
    )
    found["idempotency_record"] = round(with_key - found["pending_entry"], 1)
    held = [30_000_000 + i for i in range(ACCOUNTS)]
    _load(lua, client, held)
    _run(lua, client, [_apply(lua, held[i % ACCOUNTS], 3 * 10**12 + i, kind="R") for i in range(n)])
    # a hold is a few bytes: measured as what releasing them all frees (ledger_post), not as the difference of two
    # deltas of entries 10 times its size
    freed = measure(
        "hold",
        lambda: _run(
            lua,
            client,
            [
                (
                    "ledger_post",
                    [
                        f"user:balance:{{{held[i % ACCOUNTS]}}}",
                        f"user:held:{{{held[i % ACCOUNTS]}}}",
                        f"user:holds:{{{held[i % ACCOUNTS]}}}",
                    ],
                    [3 * 10**12 + i],
                )
                for i in range(n)
            ],
        ),
    )
    found["hold"] = round(-freed, 1)
    queue = "bench-memory"
    measure(
        "delay_element",
        lambda: _run(
            lua,
            client,
            [("delay_offer", keys.delay_offer_keys(queue), [f"order-{i:09d}", 2**41 + i, 0]) for i in range(n)],
        ),
    )
    voucher = 990_000_001
    client.hset(
        keys.voucher(voucher),
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
    names = [
        keys.voucher(voucher),
        keys.voucher_buyers(voucher),
        keys.voucher_pending(voucher),
        keys.voucher_stream(voucher),
        keys.voucher_away(voucher),
    ]
    now = int(time.time() * 1000)
    measure(
        "voucher_buyer",
        lambda: _run(
            lua, client, [("voucher_order", names, [voucher, 1 + i, 4 * 10**12 + i, now, "", 0, 1]) for i in range(n)]
        ),
    )
    packet = 990_000_002

    def items() -> None:
        for start in range(0, n, 10_000):
            client.rpush(
                keys.packet_unclaimed(packet),
                *(f"{5 * 10**12 + i};{1 + i % 500}" for i in range(start, min(n, start + 10_000))),
            )

    measure("redpacket_item", items)
    client.flushall()
    return {
        name: {"bytes": value, "per_gib": stats.per_gib(value) if value > 0 else None} for name, value in found.items()
    }
