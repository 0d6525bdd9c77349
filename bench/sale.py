"""Flash-sale and red-packet benchmarks (called by bench/run.py; figures, never assertions).

- seckill: attempts/s through the API handler (Lambda's one-request-per-process model) on one voucher,
  every attempt a new buyer, against the same sale done with DB row locks only (SELECT ... FOR UPDATE,
  INSERT, UPDATE stock, COMMIT per attempt) by the same number of processes in the same run.
- red packets: the grab script alone on one Redis (redis-benchmark EVALSHA, as the seed measured its
  script with 20 threads), against the seed's own script in the same run; and grabs/s through the handler.
- transports: end-to-end persisted voucher orders/s through Kafka (MSK consumer) and Redis Streams (drainer).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from workers import START_ALLOWANCE_S, gather

REPO = Path(__file__).resolve().parents[1]
# workers bound by a number of attempts rather than a time window: far more than those take here, and still an end
ATTEMPTS_BOUND_S = 600

# the seed's script (article 001), keys and all, as the baseline of the grab benchmark
SEED_GRAB = """
if redis.call('hexists', KEYS[3], KEYS[4]) ~= 0 then
  return nil
else
  local hongBao = redis.call('rpop', KEYS[1]);
  if hongBao then
    local x = cjson.decode(hongBao);
    x['userId'] = KEYS[4];
    local re = cjson.encode(x);
    redis.call('hset', KEYS[3], KEYS[4], KEYS[4]);
    redis.call('lpush', KEYS[2], re);
    return re;
  end
end
return nil
"""


def _handler_call(transport: str):
    os.environ["EVENT_TRANSPORT"] = transport
    sys.stdout = open(os.devnull, "w")  # EMF lines per invocation only cost terminal time
    from api.app import handler

    from infra import dev_issuer
    from infra.localrt import events

    context = events.LambdaContext("ApiFunction")
    backend = dev_issuer.caller_context(None, ("service", "admin"))  # as the authorizer passes the backend

    def call(method: str, path: str, body=None):
        response = handler(events.api_gateway_proxy(method, path, json.dumps(body), authorizer=backend), context)
        return response["statusCode"], json.loads(response["body"])

    return call


def open_window(start_at: float) -> float:
    """Wait, spawned and imported, for the measured window to open, so no worker's warm-up attempts are counted in
    it; how late this worker is for it (more than 0: it counted less than the window, the figure is low)."""
    late = time.monotonic() - start_at
    if late < 0:
        time.sleep(-late)
    return max(0.0, late)


def _order_worker(transport: str, voucher_id: str, first_user: int, start_at: float, stop_at: float, max_attempts: int,
                  out) -> None:
    call = _handler_call(transport)
    late = open_window(start_at)
    codes: dict = {}
    attempts = 0
    while time.monotonic() < stop_at and attempts < max_attempts:
        status, body = call("POST", f"/vouchers/{voucher_id}/orders", {"user_id": first_user + attempts})
        attempts += 1
        code = 200 if status == 200 else body["error"]["code"]
        codes[code] = codes.get(code, 0) + 1
    out.put((codes, late))


def orders_window(voucher_id: str, procs: int, first_user: int, seconds: float, warmup: float) -> tuple[dict, float]:
    """`procs` buyers ordering as fast as they can for `seconds` once `warmup` s passed: their answers' codes, and
    how late the latest of them was for the window."""
    start_at = time.monotonic() + warmup
    results = gather(_order_worker, [("kafka", voucher_id, first_user + 10_000_000 * i, start_at, start_at + seconds, 10**9)
                                     for i in range(procs)], warmup + seconds + START_ALLOWANCE_S)
    return _merge([codes for codes, _ in results]), max(late for _, late in results)


def _merge(results: list[dict]) -> dict:
    merged: dict = {}
    for codes in results:
        for code, n in codes.items():
            merged[code] = merged.get(code, 0) + n
    return merged


def create_voucher(call, stock: int) -> str:
    now = int(time.time() * 1000)
    status, body = call("POST", "/vouchers", {"title": "bench", "stock": stock, "begin_at": now - 1000, "end_at": now + 86_400_000})
    assert status == 201, body
    return body["voucher_id"]


def seckill_service(call, procs: int, seconds: float, stock: int) -> dict:
    voucher_id = create_voucher(call, stock)
    codes, late = orders_window(voucher_id, procs, 10_000_000, seconds, warmup=8.0)  # spawn and import, on a shared machine
    status, view = call("GET", f"/vouchers/{voucher_id}", None)
    return {"seckill_attempts_per_s": round(sum(codes.values()) / seconds, 1), "seckill_workers_late_s": round(late, 2),
            "seckill_orders": codes.get(200, 0),
            "seckill_stock": stock, "seckill_oversell": max(0, codes.get(200, 0) - stock) + max(0, -view["stock_left"])}


def _db_sale_worker(db: dict, voucher_id: int, first_user: int, start_at: float, stop_at: float, out) -> None:
    import pymysql

    conn = pymysql.connect(**db, autocommit=False)
    late = open_window(start_at)
    attempts = sold = 0
    with conn.cursor() as cur:
        while time.monotonic() < stop_at:
            user = first_user + attempts
            attempts += 1
            cur.execute("SELECT stock FROM t_seckill_voucher WHERE id = %s FOR UPDATE", (voucher_id,))
            (stock,) = cur.fetchone()
            cur.execute("SELECT 1 FROM t_voucher_order WHERE voucher_id = %s AND user_id = %s", (voucher_id, user))
            if stock > 0 and not cur.fetchone():
                cur.execute("INSERT INTO t_voucher_order (id, voucher_id, user_id, seq, create_time) VALUES (%s, %s, %s, 1, NOW(3))",
                            (user * 1000 + voucher_id % 1000, voucher_id, user))
                cur.execute("UPDATE t_seckill_voucher SET stock = stock - 1 WHERE id = %s AND stock > 0", (voucher_id,))
                sold += 1
            conn.commit()
    out.put({"attempts": attempts, "sold": sold, "late": late})


def seckill_db_baseline(call, db: dict, procs: int, seconds: float, stock: int) -> dict:
    voucher_id = int(create_voucher(call, stock))
    warmup = 3.0
    start_at = time.monotonic() + warmup
    results = gather(_db_sale_worker, [(db, voucher_id, 50_000_000 * (i + 1), start_at, start_at + seconds) for i in range(procs)],
                     warmup + seconds + START_ALLOWANCE_S)
    attempts = sum(r["attempts"] for r in results)
    return {"seckill_db_locks_attempts_per_s": round(attempts / seconds, 1),
            "seckill_db_locks_workers_late_s": round(max(r["late"] for r in results), 2),
            "seckill_db_locks_oversell": max(0, sum(r["sold"] for r in results) - stock)}


def _redis_benchmark(port: int, clients: int, requests: int, *command: str, pipeline: int = 1) -> float:
    cmd = ["redis-benchmark", "-p", str(port), "-c", str(clients), "-n", str(requests), "-r", "1000000000", "-P", str(pipeline),
           "-q", *command]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(re.findall(r"([\d.]+) requests per second", out)[-1])


def redpacket_script(redis_port: int, clients: int, requests: int) -> dict:
    """Both scripts pop from a list of `requests` packets, each call a random user (rare repeats answer 'already')."""
    import redis

    from hotledger import keys

    client = redis.Redis(port=redis_port)
    packet_id = 424242
    ours = [keys.packet(packet_id), keys.packet_unclaimed(packet_id), keys.packet_grabbers(packet_id),
            keys.packet_pending(packet_id), keys.packet_stream(packet_id)]
    seed = ["hongBaoList", "hongBaoConsumedList", "hongBaoConsumedMap"]
    client.delete(*ours, *seed)
    client.hset(ours[0], mapping={"state": "OPEN", "expires_at": 2**50, "hold_until": 0})
    pipe = client.pipeline(transaction=False)
    for start in range(0, requests, 10_000):
        items = range(start, min(start + 10_000, requests))
        pipe.rpush(ours[1], *(f"{9_000_000_000 + i};{1 + i % 500}" for i in items))
        pipe.lpush(seed[0], *(json.dumps({"id": i, "money": 1 + i % 500}) for i in items))
    pipe.execute()
    grab_sha = client.script_load((REPO / "layers/lua/redpacket_grab.lua").read_text())
    seed_sha = client.script_load(SEED_GRAB)
    ours_per_s = _redis_benchmark(redis_port, clients, requests, "evalsha", grab_sha, "5", *ours, str(packet_id),
                                  "__rand_int__", "1700000000000", "__rand_int__", "")
    seed_per_s = _redis_benchmark(redis_port, clients, requests, "evalsha", seed_sha, "4", *seed, "__rand_int__")
    grabbed = requests - client.llen(ours[1])
    # Redis's own cost of the script: 16 calls per round trip, so the client's and the network's share drops out
    client.rpush(ours[1], *(f"{8_000_000_000 + i};1" for i in range(grabbed)))
    pipelined = _redis_benchmark(redis_port, clients, requests, "evalsha", grab_sha, "5", *ours, str(packet_id),
                                 "__rand_int__", "1700000000000", "__rand_int__", "", pipeline=16)
    return {"redpacket_grabs_per_s": ours_per_s, "redpacket_seed_script_grabs_per_s": seed_per_s,
            "redpacket_vs_seed_script_ratio": round(ours_per_s / seed_per_s, 3), "redpacket_grabbed_items": grabbed,
            "redpacket_grabs_per_s_pipelined_16": pipelined}


def seckill_script(redis_port: int, clients: int, requests: int) -> float:
    """voucher_order.lua alone (redis-benchmark): every call a new buyer, the stock large enough never to run out."""
    import redis

    from hotledger import keys

    client = redis.Redis(port=redis_port)
    voucher_id = 434343
    names = [keys.voucher(voucher_id), keys.voucher_buyers(voucher_id), keys.voucher_pending(voucher_id),
             keys.voucher_stream(voucher_id), keys.voucher_away(voucher_id)]
    client.delete(*names)
    client.hset(names[0], mapping={"stock": 10**12, "begin": 0, "end": 2**50, "limit": 1, "epoch": "bench", "hold_until": 0,
                                   "db_version": 0})
    sha = client.script_load((REPO / "layers/lua/voucher_order.lua").read_text())
    per_s = _redis_benchmark(redis_port, clients, requests, "evalsha", sha, "5", *names, str(voucher_id), "__rand_int__",
                             "__rand_int__", "1700000000000", "", "0", "1")
    client.delete(*names)
    return per_s


def _grab_worker(packet_id: str, grabbers: list[int], out) -> None:
    call = _handler_call("kafka")
    started, codes = time.monotonic(), {}
    for user in grabbers:
        status, body = call("POST", f"/redpackets/{packet_id}/grab", {"user_id": user})
        code = 200 if status == 200 else body["error"]["code"]
        codes[code] = codes.get(code, 0) + 1
    out.put((codes, time.monotonic() - started))


def redpacket_service(call, procs: int, grabs: int) -> dict:
    status, body = call("POST", "/accounts", {"user_name": f"rp-sender-{time.monotonic_ns()}"})
    sender = body["user_id"]
    call("POST", f"/accounts/{sender}/recharge", {"amount": "100000.00"})
    users = [call("POST", "/accounts", {"user_name": f"rp-{time.monotonic_ns()}"})[1]["user_id"] for _ in range(grabs)]
    packet_id = call("POST", "/redpackets", {"sender_id": sender, "total": f"{grabs}.00", "count": grabs})[1]["packet_id"]
    results = gather(_grab_worker, [(packet_id, users[i::procs]) for i in range(procs)], ATTEMPTS_BOUND_S)
    codes = _merge([c for c, _ in results])
    return {"redpacket_service_grabs_per_s": round(codes.get(200, 0) / max(t for _, t in results), 1)}


def transport_orders_per_s(env: dict, transport: str, procs: int, orders: int, log_path: Path) -> float:
    """Persisted orders/s end to end: the clock runs from the first order until the last one is in the DB."""
    from hotledger import runtime
    from hotledger.dal import db

    from hotledger.config import settings
    from infra import services

    # a topic of its own: the records earlier steps left unread (their runtimes ran for their own figures) are not
    # this figure's work
    shared_topic, topic = os.environ["KAFKA_TOPIC"], f"{os.environ['KAFKA_TOPIC']}.{transport}"
    services.ensure_topic(settings().kafka_bootstrap, topic, services.LOCAL_PARTITIONS)
    os.environ.update(EVENT_TRANSPORT=transport, KAFKA_TOPIC=topic)
    runtime.reset()
    try:
        voucher_id = create_voucher(_handler_call(transport), orders)
    finally:
        os.environ["EVENT_TRANSPORT"] = "kafka"
        runtime.reset()
    writer_env = {**env, "EVENT_TRANSPORT": transport, "HOTLEDGER_LOCAL_SCHEDULE_RATE_S": "0.2",
                  "STREAM_GROUP": f"bench-{time.monotonic_ns()}", "KAFKA_TOPIC": topic}
    writer = subprocess.Popen([sys.executable, "-m", "infra.localrt.runtime", "--no-api"], cwd=REPO, env=writer_env,
                              stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    try:
        time.sleep(8)  # consumer group join / first drainer run
        started = time.monotonic()
        gather(_order_worker, [(transport, voucher_id, 70_000_000 * (i + 1), started, started + ATTEMPTS_BOUND_S, orders // procs)
                               for i in range(procs)], ATTEMPTS_BOUND_S + START_ALLOWANCE_S)
        expected = (orders // procs) * procs
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if db.query("SELECT COUNT(*) FROM t_voucher_order WHERE voucher_id = %s", (int(voucher_id),))[0][0] >= expected:
                break
            time.sleep(0.05)
        return round(expected / (time.monotonic() - started), 1)
    finally:
        os.environ["KAFKA_TOPIC"] = shared_topic
        runtime.reset()
        writer.terminate()
        writer.wait()
