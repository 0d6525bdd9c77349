"""In-process clients of the API handler: one spawned process per worker, one request in flight per process (as one
Lambda container serves), counted in the measured window only. Every worker spawns and imports, then runs (as warm-up)
until the window opens (wall clock, the same for all): every worker waits, imported and connected, at a barrier,
and the window opens WARM_UP_S after the last one arrived; only requests started in [window start, window end) are
counted, and their rate is over that window. A worker that was not running when the window opened says by how much
it was late (its count then covers less than the window: the rate is low, never high)."""

from __future__ import annotations

import json
import os
import sys
import time

from workers import START_ALLOWANCE_S, gather

# every worker running (warm connections, caches, the JIT-free interpreter's first calls) before the window opens
WARM_UP_S = 2.0


class LambdaStdout:
    """stdout as the Lambda runtime gives it to a function (awslambdaric's bootstrap wraps it before it imports the
    handler): every write flushed at once, so each log or EMF line costs its own write, here into /dev/null. A
    buffered stdout would batch them and flatter the handler."""

    def __init__(self) -> None:
        self._stream = open(os.devnull, "w")  # noqa: SIM115 - the worker's stdout for its whole life

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._stream.flush()
        return written

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def quiet() -> None:
    """Workers print log and EMF lines per invocation: written as in Lambda, where nobody reads them."""
    sys.stdout = LambdaStdout()


def backend_caller() -> dict:
    """The caller the benchmarks act as: the backend with both scopes, as the authorizer passes it."""
    from infra import dev_issuer

    return dev_issuer.caller_context(None, ("service", "admin"))


def api():
    """call(method, path, body) -> (status, body) through api.app.handler with API Gateway events."""
    from api.app import handler
    from infra.localrt import events

    context, caller = events.LambdaContext("ApiFunction"), backend_caller()

    def call(method: str, path: str, body=None) -> tuple[int, dict]:
        response = handler(
            events.api_gateway_proxy(method, path, json.dumps(body) if body is not None else None, authorizer=caller),
            context,
        )
        return response["statusCode"], json.loads(response["body"])

    return call


def open_window(ready, window, seconds: float, warm_up_s: float) -> tuple[float, float]:
    """Wait for every worker at `ready` (a Barrier); the first through sets the shared window (a 2-double Array)."""
    if ready.wait(timeout=START_ALLOWANCE_S) == 0:
        window[0] = time.time() + warm_up_s
        window[1] = window[0] + seconds
    ready.wait(timeout=START_ALLOWANCE_S)
    return window[0], window[1]


def deduct_worker(
    user_ids: list[int],
    ready,
    window,
    seconds: float,
    warm_up_s: float,
    rate_per_s: float,
    baseline: str | None,
    acks,
    out,
) -> None:
    """Deducts of 0.01 over user_ids until stop_at, paced at rate_per_s when it is set (else as fast as one request in
    flight allows). Hands back the window's latencies (ms), its counts, and how late the worker was for it; with
    `acks` (a queue), every acknowledged deduct of the window as (order id, ack wall-clock ms) as it happens."""
    quiet()
    if baseline:
        import baselines

        baselines.patch(baseline)
    call = api()
    latencies, ok, failed, i, cpu_from = [], 0, 0, 0, None
    warm_until, stop_at = open_window(ready, window, seconds, warm_up_s)
    late = max(0.0, time.time() - warm_until)
    next_at = time.time()
    while True:
        if rate_per_s:
            next_at += 1 / rate_per_s
            pause = next_at - time.time()
            if pause > 0:
                time.sleep(pause)
            elif pause < -1 / rate_per_s:  # behind: the slots missed are dropped, never made up in a burst
                next_at = time.time()
        started = time.time()
        if started >= stop_at:
            break
        if cpu_from is None and started >= warm_until:
            cpu_from = time.process_time()
        user_id = user_ids[i % len(user_ids)]
        i += 1
        status, body = call("POST", f"/accounts/{user_id}/deduct", {"amount": "0.01"})
        ended = time.time()
        if started < warm_until:
            continue
        latencies.append((ended - started) * 1000)
        if status == 200:
            ok += 1
            if acks is not None:
                acks.put((int(body["order_id"]), ended * 1000))
        else:
            failed += 1
    # the window's CPU of this process: the handler's, and the caller's event building around it (a small part)
    cpu_s = time.process_time() - cpu_from if cpu_from is not None else 0.0
    out.put(
        {
            "latencies": latencies,
            "ok": ok,
            "failed": failed,
            "late": late,
            "window": (warm_until, stop_at),
            "cpu_s": cpu_s,
        }
    )


def barrier(procs: int):
    """The Barrier and shared window (start, end) of `procs` workers, for open_window."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    return ctx.Barrier(procs), ctx.Array("d", 2)


def deducts(
    procs: int,
    user_ids: list[int],
    seconds: float,
    rate_per_s: float = 0,
    baseline: str | None = None,
    acks=None,
    warm_up_s: float = WARM_UP_S,
) -> dict:
    """`procs` deduct workers side by side (user ids dealt out among them): the window's latencies, acknowledged and
    failed counts, the window itself, the latest worker's lateness and the workers' CPU seconds in the window."""
    ready, window = barrier(procs)
    per_worker = [user_ids[i::procs] or user_ids for i in range(procs)]
    results = gather(
        deduct_worker,
        [
            (mine, ready, window, seconds, warm_up_s, rate_per_s / procs if rate_per_s else 0, baseline, acks)
            for mine in per_worker
        ],
        warm_up_s + seconds + 2 * START_ALLOWANCE_S,
    )
    return {
        "latencies": [x for r in results for x in r["latencies"]],
        "ok": sum(r["ok"] for r in results),
        "failed": sum(r["failed"] for r in results),
        "window": results[0]["window"],
        "late": round(max(r["late"] for r in results), 2),
        "cpu_s": sum(r["cpu_s"] for r in results),
    }
