"""Cost per million deducts, red-packet grabs and voucher orders on AWS, request-driven only (the stack's fixed monthly
cost is in docs/operations.md, Cost), from list prices named below with the date they were read, the template's
resources (each function's memory) and what this run measures; beside it the same deduct built the usual serverless
way (API Gateway REST + Lambda + DynamoDB transactions), from list prices.

Measured here, in a fresh process at the API function's template settings (bench/hotpath.py's production_env), per
warm deduct through the real handler with each front door's events (FrontDoor http: HTTP API payload v2 behind its
JWT authorizer; rest: REST payload v1 behind the Lambda authorizer): the function's CPU, and the bytes of the log
and EMF lines it prints (what CloudWatch Logs ingests from it). The function is billed for its duration at the
template's memory: the CPU stretched by the share of a vCPU that memory buys (Lambda gives 1 vCPU at 1,769 MB, so 512
MB is 0.29 vCPU), plus the waits for Redis and the broker's ack (estimates: no AWS round trip is measured here),
rounded up to Lambda's 1 ms. The writer is billed for its batch time per row, from the run's writer figure.
Numbers that are estimates, not measurements, are named as such.

    PYTHONPATH=functions:. .venv/bin/python bench/cost.py [bench/results.json]
(prints the cost lines from a results file; `make bench` runs figures() as its cost stage, measuring anew)
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# us-east-1 list prices, read 2026-11-28 (docs/performance.md, Cost, cites each page)
PRICES_AS_OF = "2026-11-28"
HTTP_API_PER_MILLION = 1.00  # first 300 million a month
REST_API_PER_MILLION = 3.50  # first 333 million a month
LAMBDA_PER_MILLION_REQUESTS = 0.20
LAMBDA_ARM_PER_GB_S = 0.0000133334  # first 7.5 billion GB-s a month
MSK_SERVERLESS_IN_PER_GB = 0.10
MSK_SERVERLESS_OUT_PER_GB = 0.05
AURORA_PER_MILLION_IO = 0.20  # Aurora Standard (I/O-Optimized: none, compute +30%)
CLOUDWATCH_LOGS_PER_GB = 0.50  # ingestion, standard class
XRAY_PER_MILLION_TRACES = 5.00  # traces recorded
DYNAMODB_PER_MILLION_WRU = 0.625  # on-demand write request units (1 KB; a transactional write takes 2)

LAMBDA_VCPU_MB = 1769  # Lambda's memory per vCPU: a function gets memory / 1769 of one

# estimates, not measured here
EVENT_BYTES = 300  # one signed event on the broker (in and out once)
# a persisted row's redo (the entry, the order, their index entries; the account's row is updated once per batch)
# stays under 1 KB, and Aurora counts write I/O per 4 KB of redo it ships: batches pack rows, reads hit the cache
AURORA_IO_PER_ROW = 0.25
REDIS_WAIT_MS = 0.5  # one EVALSHA round trip in the AZ (ElastiCache)
BROKER_ACK_MS = 3.0  # MSK acks=all: the leader waits for its replicas in the other AZs
PLATFORM_LOG_BYTES = 330  # Lambda's START, END and REPORT lines per invocation, unless SystemLogLevel leaves them out
ACCESS_LOG_BYTES = {"http": 260, "rest": 330}  # API Gateway's access log line of the template's format
XRAY_ACTIVE_SAMPLED = 0.05  # Lambda's sampling with Tracing: Active: the first request each second, then 5%
PEER_DEDUCT_WRU = 6  # TransactWriteItems: the balance (conditional update), the ledger entry, the idempotency key
PEER_DURATION_MS = 12  # TransactWriteItems p50 (two-phase across the items' partitions), plus the function's own work

FRONT_DOORS = {"http": HTTP_API_PER_MILLION, "rest": REST_API_PER_MILLION}
DEFAULT_FRONT_DOOR = "http"
MEASURED_DEDUCTS = 300
WARM_UP = 100


def template_memory_gb(name: str) -> float:
    """The function's MemorySize (its own, else the Globals') in GB."""
    from infra.localrt.template import _read

    template = _read(REPO / "template.yaml")
    own = template["Resources"][name]["Properties"].get("MemorySize")
    return int(own or template["Globals"]["Function"]["MemorySize"]) / 1024


def api_function_observability() -> tuple[int, float]:
    """The API function's Lambda platform log bytes per invocation and the share of its invocations X-Ray records,
    from the template's defaults (LoggingConfig's SystemLogLevel, Tracing)."""
    from infra.localrt.template import _read, _value

    template = _read(REPO / "template.yaml")
    own = template["Resources"]["ApiFunction"]["Properties"]
    system_level = (own.get("LoggingConfig") or {}).get("SystemLogLevel", "INFO")
    tracing = _value(template, own.get("Tracing", template["Globals"]["Function"].get("Tracing")))
    # PassThrough behind the HTTP API: nothing upstream samples (behind REST, its stage samples: counted as Active)
    return (PLATFORM_LOG_BYTES if system_level in ("DEBUG", "INFO") else 0), (
        XRAY_ACTIVE_SAMPLED if tracing == "Active" else 0.0
    )


def billed_ms(cpu_us: float, memory_gb: float) -> int:
    """The API function's billed duration of one deduct: its CPU at the vCPU share its memory buys, plus the waits."""
    vcpu = memory_gb * 1024 / LAMBDA_VCPU_MB
    return math.ceil(cpu_us / 1000 / vcpu + REDIS_WAIT_MS + BROKER_ACK_MS)


def per_million(
    front_door: str,
    api_ms: float,
    api_gb: float,
    log_bytes: float,
    writer_s_per_row: float,
    writer_gb: float,
    rows: int,
    events: int,
    platform_log_bytes: int,
    xray_sampled: float,
) -> dict:
    """USD per million requests, by line. The REST front door's stage traces by X-Ray's default rule (1/s + 5%)."""
    lines = {
        "api_gateway": FRONT_DOORS[front_door],
        "api_function": LAMBDA_PER_MILLION_REQUESTS + 1e6 * api_gb * api_ms / 1000 * LAMBDA_ARM_PER_GB_S,
        "writer_function": 1e6 * rows * writer_s_per_row * writer_gb * LAMBDA_ARM_PER_GB_S,
        "msk_data": 1e6 * events * EVENT_BYTES / 1e9 * (MSK_SERVERLESS_IN_PER_GB + MSK_SERVERLESS_OUT_PER_GB),
        "aurora_io": rows * AURORA_IO_PER_ROW * AURORA_PER_MILLION_IO,
        "logs": 1e6 * (log_bytes + platform_log_bytes + ACCESS_LOG_BYTES[front_door]) / 1e9 * CLOUDWATCH_LOGS_PER_GB,
        "xray": (XRAY_ACTIVE_SAMPLED if front_door == "rest" else xray_sampled) * XRAY_PER_MILLION_TRACES,
    }
    lines = {name: round(usd, 3) for name, usd in lines.items()}
    lines["total"] = round(sum(lines.values()), 2)
    return lines


def peer_per_million(log_bytes: float, api_gb: float) -> dict:
    """The usual serverless deduct, from list prices: API Gateway REST (a Cognito authorizer: no invocation), one
    Lambda running a DynamoDB transaction (on demand), the same log lines and X-Ray sampling as ours."""
    lines = {
        "api_gateway": REST_API_PER_MILLION,
        "api_function": LAMBDA_PER_MILLION_REQUESTS + 1e6 * api_gb * PEER_DURATION_MS / 1000 * LAMBDA_ARM_PER_GB_S,
        "dynamodb_writes": PEER_DEDUCT_WRU * DYNAMODB_PER_MILLION_WRU,
        "logs": 1e6 * (log_bytes + PLATFORM_LOG_BYTES + ACCESS_LOG_BYTES["rest"]) / 1e9 * CLOUDWATCH_LOGS_PER_GB,
        "xray": XRAY_ACTIVE_SAMPLED * XRAY_PER_MILLION_TRACES,
    }
    lines = {name: round(usd, 3) for name, usd in lines.items()}
    lines["total"] = round(sum(lines.values()), 2)
    return lines


# route -> (rows persisted per request, events published per request): a grab is the claim and the credit
WORK = {"deduct": (1, 1), "grab": (2, 2), "voucher_order": (1, 1)}


class _CountedStream:
    """Counts the bytes written (the function's stdout: what Lambda ships to CloudWatch Logs)."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, text: str) -> int:
        self.bytes += len(text.encode())
        return len(text)

    def flush(self) -> None:
        pass


def _deduct_event(front_door: str, user_id: int) -> dict:
    """One deduct of the backend as the front door's API Gateway hands it to the function."""
    from infra import dev_issuer
    from infra.localrt import events

    path, body, headers = f"/accounts/{user_id}/deduct", '{"amount": "0.01"}', {"Content-Type": "application/json"}
    if front_door == "http":
        claims = dev_issuer.jwt_authorizer_context(None, ("service",))
        return events.api_gateway_http("POST", path, body, headers, jwt=claims)
    caller = dev_issuer.caller_context(None, ("service",))
    return events.api_gateway_proxy("POST", path, body, headers, authorizer=caller)


def measure_function(deducts: int = MEASURED_DEDUCTS) -> dict:
    """front door -> {cpu_us, log_bytes} per warm deduct through the handler, in this process (the child of
    measured())."""
    import clients
    import hotpath

    from api import app
    from infra.localrt import events

    clients.quiet()
    user_id = hotpath._hot_account(clients.api())
    context, stream = events.LambdaContext("ApiFunction"), _CountedStream()
    found = {}
    for front_door in FRONT_DOORS:
        for _ in range(WARM_UP):
            app.handler(_deduct_event(front_door, user_id), context)
        payloads = [_deduct_event(front_door, user_id) for _ in range(deducts)]
        log_handler, stdout = app.logger.registered_handler, sys.stdout
        before = log_handler.setStream(stream)  # the charge's log line
        sys.stdout = stream  # the EMF line
        try:
            started = time.process_time()
            for n, event in enumerate(payloads):
                os.environ["_X_AMZN_TRACE_ID"] = hotpath._trace_header(n)
                assert app.handler(event, context)["statusCode"] == 200
            spent = time.process_time() - started
        finally:
            sys.stdout = stdout
            log_handler.setStream(before)
        found[front_door] = {"cpu_us": round(spent / deducts * 1e6, 1), "log_bytes": round(stream.bytes / deducts)}
        stream.bytes = 0
    return found


def measured(deducts: int = MEASURED_DEDUCTS) -> dict:
    """measure_function() in a fresh process at the API function's template settings, on this process's servers."""
    import hotpath

    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure", str(deducts)],
        env=hotpath._child_env(),
        stdout=subprocess.PIPE,
        check=True,
        text=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def figures(measured_function: dict, writer_rows_per_s_per_partition: float | None) -> dict:
    """Per front door and route, the cost lines per million; the peer's deduct; the measurements they rest on."""
    api_gb, writer_gb = template_memory_gb("ApiFunction"), template_memory_gb("WriterFunction")
    writer_s = 1 / writer_rows_per_s_per_partition if writer_rows_per_s_per_partition else 0.0
    platform_log_bytes, xray_sampled = api_function_observability()
    out: dict = {"prices_as_of": PRICES_AS_OF, "measured": measured_function}
    for front_door, function in measured_function.items():
        api_ms = billed_ms(function["cpu_us"], api_gb)
        out[front_door] = {
            route: {
                "api_ms": api_ms,
                **per_million(
                    front_door,
                    api_ms,
                    api_gb,
                    function["log_bytes"],
                    writer_s,
                    writer_gb,
                    rows,
                    events,
                    platform_log_bytes,
                    xray_sampled,
                ),
            }
            for route, (rows, events) in WORK.items()
        }
    out["peer_deduct"] = peer_per_million(measured_function["rest"]["log_bytes"], api_gb)
    return out


def main() -> int:
    if sys.argv[1:2] == ["--measure"]:
        real_stdout = sys.stdout
        found = measure_function(int(sys.argv[2]))
        real_stdout.write(json.dumps(found) + "\n")
        return 0
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / "results.json"
    print(json.dumps(json.loads(path.read_text())["cost"], indent=2))
    return 0


if __name__ == "__main__":
    sys.path[:0] = [str(REPO / "functions"), str(REPO), str(REPO / "bench")]
    sys.exit(main())
