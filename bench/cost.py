"""Cost per million deducts, red-packet grabs and voucher orders on AWS: the template's resources (Lambda memory and
architecture), the run's measured durations, and list prices as named constants with the date they were read.

What varies with requests only (the stack's fixed monthly cost is in docs/operations.md, Cost). The API function is
billed for the wall time of a request: taken as the HTTP p50 at the lowest offered rate of `make bench` (the local
runtime's own HTTP and authorizer time included, so an upper estimate); the writer for its batch time per row, from
the writer's rows/s per partition (one poller each). Numbers that are estimates, not measurements, say so.

    PYTHONPATH=functions:. .venv/bin/python bench/cost.py [bench/results.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# us-east-1 on-demand list prices, as read for the cost tables in docs/ (its commit of 2026-11-24); this machine has no
# network to read them again: check them on the AWS pricing pages before relying on a total
PRICES_AS_OF = "2026-11-24"
API_GATEWAY_REST_PER_MILLION = 3.50
LAMBDA_PER_MILLION_REQUESTS = 0.20
LAMBDA_ARM_PER_GB_S = 0.0000133334
MSK_SERVERLESS_IN_PER_GB = 0.10
MSK_SERVERLESS_OUT_PER_GB = 0.05
AURORA_PER_MILLION_IO = 0.20
CLOUDWATCH_LOGS_PER_GB = 0.50
XRAY_PER_MILLION_TRACES = 5.00

# estimates, not measured here
EVENT_BYTES = 300  # one signed event on the broker (in and out once)
AURORA_IO_PER_ROW = 4  # batched multi-row INSERTs and the account upsert, per persisted row
LOG_BYTES_PER_REQUEST = 1300  # the function's one line per charge + API Gateway's access log line
XRAY_SAMPLED = 0.05  # default sampling: 1/s + 5%


def template_memory_gb(name: str) -> float:
    """The function's MemorySize (its own, else the Globals') in GB."""
    from infra.localrt.template import _read

    template = _read(REPO / "template.yaml")
    own = template["Resources"][name]["Properties"].get("MemorySize")
    return int(own or template["Globals"]["Function"]["MemorySize"]) / 1024


def per_million(
    api_ms: float, api_gb: float, writer_s_per_row: float, writer_gb: float, rows: int, events: int
) -> dict:
    """USD per million requests, by line."""
    lines = {
        "api_gateway": API_GATEWAY_REST_PER_MILLION,
        "api_function": LAMBDA_PER_MILLION_REQUESTS + 1e6 * api_gb * api_ms / 1000 * LAMBDA_ARM_PER_GB_S,
        "writer_function": 1e6 * rows * writer_s_per_row * writer_gb * LAMBDA_ARM_PER_GB_S,
        "msk_data": 1e6 * events * EVENT_BYTES / 1e9 * (MSK_SERVERLESS_IN_PER_GB + MSK_SERVERLESS_OUT_PER_GB),
        "aurora_io": rows * AURORA_IO_PER_ROW * AURORA_PER_MILLION_IO,
        "logs": 1e6 * LOG_BYTES_PER_REQUEST / 1e9 * CLOUDWATCH_LOGS_PER_GB,
        "xray": 1e6 * XRAY_SAMPLED / 1e6 * XRAY_PER_MILLION_TRACES,
    }
    lines = {name: round(usd, 3) for name, usd in lines.items()}
    lines["total"] = round(sum(lines.values()), 2)
    return lines


# route -> (rows persisted per request, events published per request): a grab is the claim and the credit
WORK = {"deduct": (1, 1), "grab": (2, 2), "voucher_order": (1, 1)}


def figures(latency: dict, writer_rows_per_s_per_partition: float | None) -> dict:
    """route -> cost lines per million, from the run's latency steps and writer figure."""
    api_gb, writer_gb = template_memory_gb("ApiFunction"), template_memory_gb("WriterFunction")
    writer_s = 1 / writer_rows_per_s_per_partition if writer_rows_per_s_per_partition else 0.0
    out = {"prices_as_of": PRICES_AS_OF}
    for route, (rows, events) in WORK.items():
        steps = latency.get(route, {}).get("steps") or []
        p50 = next((s["p50_ms"] for s in steps if s["p50_ms"] is not None), None)
        if p50 is None:
            out[route] = None
            continue
        out[route] = {"api_ms": p50, **per_million(p50, api_gb, writer_s, writer_gb, rows, events)}
    return out


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / "results.json"
    results = json.loads(path.read_text())
    print(
        json.dumps(
            figures(results["latency"], results["figures"]["writer_rows_per_s_per_partition"]["value"]), indent=2
        )
    )
    return 0


if __name__ == "__main__":
    sys.path[:0] = [str(REPO / "functions"), str(REPO)]
    sys.exit(main())
