"""Flash-sale and red-packet benchmarks (called by bench/run.py; figures, never assertions).

- seckill: attempts/s through the API handler (Lambda's one-request-per-process model) on one voucher whose stock
  outlasts the window, every attempt a new buyer, against the same sale behind the same handler done in the DB
  (bench/baselines.py: one stored-procedure round trip holds the row lock through its commit), same processes,
  same run; and `seckill_oversell`, a sale hammered past its stock until it is sold out (bench/hot_voucher.py).
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
    import clients

    clients.quiet()
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


def _order_worker(
    transport: str, voucher_id: str, first_user: int, start_at: float, stop_at: float, max_attempts: int, out
) -> None:
    call = _handler_call(transport)
    if isinstance(start_at, tuple):  # (Barrier, shared window, seconds): the window opens once every worker is ready
        import clients

        ready, window, seconds = start_at
        start, stop = clients.open_window(ready, window, seconds, clients.WARM_UP_S)
        start_at, stop_at = time.monotonic() + (start - time.time()), time.monotonic() + (stop - time.time())
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
    """`procs` buyers ordering as fast as they can for `seconds` once every one of them is spawned, imported and
    warmed up (bench/clients.py open_window; `warmup` only bounds the wait): their answers' codes, and how late the
    latest of them was for the window."""
    import clients

    ready, window = clients.barrier(procs)
    results = gather(
        _order_worker,
        [
            ("kafka", voucher_id, first_user + 10_000_000 * i, (ready, window, seconds), None, 10**9)
            for i in range(procs)
        ],
        warmup + seconds + 2 * START_ALLOWANCE_S,
    )
    return _merge([codes for codes, _ in results]), max(late for _, late in results)


def _merge(results: list[dict]) -> dict:
    merged: dict = {}
    for codes in results:
        for code, n in codes.items():
            merged[code] = merged.get(code, 0) + n
    return merged


def create_voucher(call, stock: int) -> str:
    now = int(time.time() * 1000)
    status, body = call(
        "POST", "/vouchers", {"title": "bench", "stock": stock, "begin_at": now - 1000, "end_at": now + 86_400_000}
    )
    assert status == 201, body
    return body["voucher_id"]


def seckill_service(call, procs: int, seconds: float) -> dict:
    """Attempts/s on a voucher whose stock outlasts the window: every attempt a sale."""
    voucher_id = create_voucher(call, 10**7)
    codes, late = orders_window(
        voucher_id, procs, 10_000_000, seconds, warmup=8.0
    )  # spawn and import, on a shared machine
    return {
        "attempts_per_s": round(sum(codes.values()) / seconds, 1),
        "attempts": sum(codes.values()),
        "refused": sum(n for code, n in codes.items() if code != 200),
        "late_s": round(late, 2),
    }


def _db_order_worker(*args) -> None:
    import baselines

    baselines.patch("sale")
    _order_worker(*args)


def seckill_db(call, procs: int, seconds: float) -> dict:
    """The same sale behind the same handler, the order one DB round trip (bench/baselines.py bench_sale)."""
    import clients

    voucher_id = create_voucher(call, 10**7)
    ready, window = clients.barrier(procs)
    results = gather(
        _db_order_worker,
        [("kafka", voucher_id, 50_000_000 * (i + 1), (ready, window, seconds), None, 10**9) for i in range(procs)],
        seconds + 2 * START_ALLOWANCE_S,
    )
    codes = _merge([c for c, _ in results])
    return {
        "attempts_per_s": round(sum(codes.values()) / seconds, 1),
        "attempts": sum(codes.values()),
        "refused": sum(n for code, n in codes.items() if code != 200),
        "late_s": round(max(late for _, late in results), 2),
    }


def _redis_benchmark(port: int, clients: int, requests: int, *command: str, pipeline: int = 1) -> float:
    cmd = [
        "redis-benchmark",
        "-p",
        str(port),
        "-c",
        str(clients),
        "-n",
        str(requests),
        "-r",
        "1000000000",
        "-P",
        str(pipeline),
        "-q",
        *command,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(re.findall(r"([\d.]+) requests per second", out)[-1])


def redpacket_script(redis_port: int, clients: int, requests: int) -> dict:
    """Both scripts pop from a list of `requests` packets, each call a random user (rare repeats answer 'already')."""
    import redis

    from hotledger import keys
    from hotledger.dal.redis_store import script_text

    client = redis.Redis(port=redis_port)
    packet_id = 424242
    ours = [
        keys.packet(packet_id),
        keys.packet_unclaimed(packet_id),
        keys.packet_grabbers(packet_id),
        keys.packet_pending(packet_id),
        keys.packet_stream(packet_id),
    ]
    seed = ["hongBaoList", "hongBaoConsumedList", "hongBaoConsumedMap"]
    client.delete(*ours, *seed)
    client.hset(ours[0], mapping={"state": "OPEN", "expires_at": 2**50, "hold_until": 0})
    pipe = client.pipeline(transaction=False)
    for start in range(0, requests, 10_000):
        items = range(start, min(start + 10_000, requests))
        pipe.rpush(ours[1], *(f"{9_000_000_000 + i};{1 + i % 500}" for i in items))
        pipe.lpush(seed[0], *(json.dumps({"id": i, "money": 1 + i % 500}) for i in items))
    pipe.execute()
    grab_sha = client.script_load(script_text(REPO / "layers/lua/redpacket_grab.lua"))
    seed_sha = client.script_load(SEED_GRAB)
    # redpacket_grab.lua called as redis-benchmark calls it, its KEYS and ARGV as the script takes them
    grab = ("evalsha", grab_sha, "5", *ours, str(packet_id), "__rand_int__", "1700000000000", "__rand_int__", "")
    ours_per_s = _redis_benchmark(redis_port, clients, requests, *grab)
    seed_per_s = _redis_benchmark(redis_port, clients, requests, "evalsha", seed_sha, "4", *seed, "__rand_int__")
    grabbed = requests - client.llen(ours[1])
    # Redis's own cost of the script: 16 calls per round trip, so the client's and the network's share drops out
    client.rpush(ours[1], *(f"{8_000_000_000 + i};1" for i in range(grabbed)))
    pipelined = _redis_benchmark(redis_port, clients, requests, *grab, pipeline=16)
    return {
        "redpacket_grabs_per_s": ours_per_s,
        "redpacket_seed_script_grabs_per_s": seed_per_s,
        "redpacket_vs_seed_script_ratio": round(ours_per_s / seed_per_s, 3),
        "redpacket_grabbed_items": grabbed,
        "redpacket_grabs_per_s_pipelined_16": pipelined,
    }


def seckill_script(redis_port: int, clients: int, requests: int) -> float:
    """voucher_order.lua alone (redis-benchmark): every call a new buyer, the stock large enough never to run out."""
    import redis

    from hotledger import keys
    from hotledger.dal.redis_store import script_text

    client = redis.Redis(port=redis_port)
    voucher_id = 434343
    names = [
        keys.voucher(voucher_id),
        keys.voucher_buyers(voucher_id),
        keys.voucher_pending(voucher_id),
        keys.voucher_stream(voucher_id),
        keys.voucher_away(voucher_id),
    ]
    client.delete(*names)
    client.hset(
        names[0],
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
    sha = client.script_load(script_text(REPO / "layers/lua/voucher_order.lua"))
    per_s = _redis_benchmark(
        redis_port,
        clients,
        requests,
        "evalsha",
        sha,
        "5",
        *names,
        str(voucher_id),
        "__rand_int__",
        "__rand_int__",
        "1700000000000",
        "",
        "0",
        "1",
    )
    client.delete(*names)
    return per_s


def _grab_worker(packet_id: str, grabbers: list[int], out) -> None:
    call = _handler_call("kafka")
    started, codes = time.monotonic(), {}
    for user in grabbers:
        status, body = call("POST", f"/redpackets/{packet_id}/grab", {"user_id": user})
        code = 200 if status == 200 else body["error"]["code"]
        codes[code] = codes.get(code, 0) + 1
    out.put((codes, (started, time.monotonic())))


def redpacket_service(call, procs: int, grabs: int) -> dict:
    status, body = call("POST", "/accounts", {"user_name": f"rp-sender-{time.monotonic_ns()}"})
    sender = body["user_id"]
    call("POST", f"/accounts/{sender}/recharge", {"amount": "100000.00"})
    users = [call("POST", "/accounts", {"user_name": f"rp-{time.monotonic_ns()}"})[1]["user_id"] for _ in range(grabs)]
    packet_id = call("POST", "/redpackets", {"sender_id": sender, "total": f"{grabs}.00", "count": grabs})[1][
        "packet_id"
    ]
    results = gather(_grab_worker, [(packet_id, users[i::procs]) for i in range(procs)], ATTEMPTS_BOUND_S)
    codes = _merge([c for c, _ in results])
    # over the union of the workers' spans (the first start to the last end), not one worker's
    span = max(end for _, (_, end) in results) - min(start for _, (start, _) in results)
    return {
        "redpacket_service_grabs_per_s": round(codes.get(200, 0) / span, 1),
        "redpacket_service_grabs": codes.get(200, 0),
    }


def transport_orders_per_s(env: dict, transport: str, procs: int, orders: int, log_path: Path) -> float:
    """Persisted orders/s end to end: the clock runs from the first order until the last one is in the DB."""
    from hotledger import runtime
    from hotledger.config import settings
    from hotledger.dal import db
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
    writer_env = {
        **env,
        "EVENT_TRANSPORT": transport,
        "HOTLEDGER_LOCAL_SCHEDULE_RATE_S": "0.2",
        "STREAM_GROUP": f"bench-{time.monotonic_ns()}",
        "KAFKA_TOPIC": topic,
    }
    with open(log_path, "wb") as log:  # the runtime writes to its own copy of the descriptor
        writer = subprocess.Popen(
            [sys.executable, "-m", "infra.localrt.runtime", "--no-api"],
            cwd=REPO,
            env=writer_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        # consumer group join / first drainer run, and the workers spawned and imported: the clock starts after
        started = time.monotonic() + 10
        gather(
            _order_worker,
            [
                (transport, voucher_id, 70_000_000 * (i + 1), started, started + ATTEMPTS_BOUND_S, orders // procs)
                for i in range(procs)
            ],
            10 + ATTEMPTS_BOUND_S + START_ALLOWANCE_S,
        )
        expected = (orders // procs) * procs
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (
                db.query("SELECT COUNT(*) FROM t_voucher_order WHERE voucher_id = %s", (int(voucher_id),))[0][0]
                >= expected
            ):
                break
            time.sleep(0.05)
        return round(expected / (time.monotonic() - started), 1)
    finally:
        os.environ["KAFKA_TOPIC"] = shared_topic
        runtime.reset()
        writer.terminate()
        writer.wait()
