"""Latency at a given load, over HTTP: deduct, red-packet grab and voucher order through the local runtime (the API
workers behind its HTTP port, the authorizer checking a bearer token on every request) at fixed offered rates.

Open loop: request i of a step is due at start + i / rate whatever the server does, each on a connection of its own,
and its latency runs from when it was due (a client that fell behind counts its own delay too, so a slow server
cannot slow the clients down and hide it). Per step: the achieved rate (answers 2xx in the window over the window),
errors (non-2xx, refused, timed out), p50 / p99 / p99.9 of the requests due after the warm-up. The knee is the
lowest offered rate whose p99 passes KNEE_MS.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import stats

REPO = Path(__file__).resolve().parents[1]
KNEE_MS = 50.0
TIMEOUT_S = 10.0
WARM_UP_S = 1.0


def _request(method: str, path: str, body: dict, token: str) -> bytes:
    text = json.dumps(body)
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(text)}\r\nConnection: close\r\n\r\n{text}"
    ).encode()


async def _one(port: int, payload: bytes, due: float, results: list) -> None:
    loop = asyncio.get_running_loop()
    delay = due - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
    status = None
    try:

        async def exchange() -> int:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(payload)
                line = await reader.readline()
                code = int(line.split()[1])
                length = 0
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = header.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                return code
            finally:
                writer.close()

        status = await asyncio.wait_for(exchange(), TIMEOUT_S)
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
        status = None
    results.append((due, (loop.time() - due) * 1000, status))


async def _step(port: int, payloads, rate: float, seconds: float) -> list:
    loop = asyncio.get_running_loop()
    start, count, results = loop.time() + 0.2, int(rate * (WARM_UP_S + seconds)), []
    tasks = [asyncio.ensure_future(_one(port, payloads(i), start + i / rate, results)) for i in range(count)]
    await asyncio.gather(*tasks)
    return [(due - start, latency, status) for due, latency, status in results]


def step(port: int, payloads, rate: float, seconds: float) -> dict:
    """One offered rate for WARM_UP_S + `seconds`; the figures of the requests due in the window."""
    results = asyncio.run(_step(port, payloads, rate, seconds))
    window = stats.in_window(results, WARM_UP_S, WARM_UP_S + seconds)
    good = [latency for _, latency, status in window if status is not None and 200 <= status < 300]
    return {
        "offered_per_s": rate,
        "achieved_per_s": round(len(good) / seconds, 1),
        "samples": len(good),
        "errors": len(window) - len(good),
        "p50_ms": stats.percentile(good, 0.5, 1),
        "p99_ms": stats.percentile(good, 0.99, 1),
        "p999_ms": stats.percentile(good, 0.999, 1),
    }


def serve(env: dict, workers: int, log_path: Path):
    """The local runtime's API alone (no pollers, no schedules) on a free port: (process, port)."""
    from infra import services

    port = services.free_port()
    with open(log_path, "wb") as log:  # the runtime writes to its own copy of the descriptor
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "infra.localrt.runtime",
                "--port",
                str(port),
                "--no-msk",
                "--no-schedules",
                "--api-workers",
                str(workers),
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while not services.reachable("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # the workers import the handler
    return proc, port


def routes(call, rates: list[float], seconds: float) -> dict:
    """The three routes' request makers: route -> payloads(step_rate) -> (i -> request bytes), each step's requests
    on entities of its own (a new buyer per order, a packet per step with an item per grab)."""
    import writer_speed

    from infra import dev_issuer

    token = dev_issuer.token(scopes=("service", "admin"))
    accounts = writer_speed.bulk_accounts(100, 10**12)
    now = int(time.time() * 1000)
    status, body = call(
        "POST", "/vouchers", {"title": "latency", "stock": 10**7, "begin_at": now - 1000, "end_at": now + 86_400_000}
    )
    voucher = body["voucher_id"]
    most = int(max(rates) * (WARM_UP_S + max(seconds, 2))) + 1
    # made as users make them, so cached at creation: a red packet's debit and a grab's credit carry the service's
    # own Idempotency-Key, which an account first loaded after its creation holds (RECOVERING) for REBUILD_HOLD_S
    grabbers = writer_speed.created_accounts(call, min(10_000, most))
    sender = writer_speed.created_accounts(call, 1, "10000000000.00")[0]

    def deduct(rate: float):
        return lambda i: _request("POST", f"/accounts/{accounts[i % len(accounts)]}/deduct", {"amount": "0.01"}, token)

    buyers = itertools.count(1_000_000, 100_000)  # a block of new buyers per step

    def order(rate: float):
        first = next(buyers)
        return lambda i: _request("POST", f"/vouchers/{voucher}/orders", {"user_id": first + i}, token)

    def grab(rate: float):
        count = min(10_000, int(rate * (WARM_UP_S + max(seconds, 2))) + 1)
        status, body = call("POST", "/redpackets", {"sender_id": sender, "total": f"{count}.00", "count": count})
        assert status in (200, 201), body
        packet = body["packet_id"]
        return lambda i: _request("POST", f"/redpackets/{packet}/grab", {"user_id": grabbers[i % len(grabbers)]}, token)

    return {"deduct": deduct, "grab": grab, "voucher_order": order}


def figures(call, env: dict, workers: int, rates: list[float], seconds: float, log_dir: Path) -> dict:
    """route -> {"steps": [step...], "knee_offered_per_s": rate or None (no knee below the highest rate tried)}."""
    makers = routes(call, rates, seconds)
    proc, port = serve(env, workers, log_dir / "latency-runtime.log")
    try:
        found = {}
        for route, make in makers.items():
            step(port, make(rates[0]), rates[0], 2)  # warm-up, not counted: every worker imported, connected, cached
            steps = [step(port, make(rate), rate, seconds) for rate in rates]
            found[route] = {
                "steps": steps,
                "knee_offered_per_s": stats.knee([(s["offered_per_s"], s["p99_ms"]) for s in steps], KNEE_MS),
            }
        return found
    finally:
        proc.terminate()
        proc.wait(30)
