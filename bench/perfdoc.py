"""docs/performance.md's figures, written from the last full `make bench` run (bench/results.json), so that the doc
quotes one run and cannot drift from it: the run's header, issue 33's goals with their baselines and verdicts, the
cost table, every figure, and each stage's time and load. Only the part between the markers is written; the prose
around it is the doc's own. A partial run (`--quick`, `--only`, `--smoke`) is never written here: its figures are
not one run of every stage. tests/unit/test_perfdoc.py keeps the doc equal to render(bench/results.json).

    PYTHONPATH=functions:. .venv/bin/python bench/perfdoc.py   (make bench runs it after a full run)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results.json"
DOC = REPO / "docs" / "performance.md"
BEGIN = "<!-- bench/perfdoc.py writes from here: edit the generator, not this -->"
END = "<!-- bench/perfdoc.py writes up to here -->"

# issue 33's goals, in the order the issue names them: (figure, what it says)
GOALS = [
    (
        "hot_account_ceiling_ratio",
        "goal 2: one hot account's serialized time per deduct, the DB's row lock over Redis's thread",
    ),
    ("hot_account_aws_ceiling_ratio", "goal 2: the same modelled for AWS (in-AZ round trips under the row lock)"),
    ("sync_vs_lean_ratio", "goal 3: the product's SYNC deduct over the lean one-round-trip DB baseline, same handler"),
    ("cost_per_million_deduct_usd", "goal 4: request-driven USD per million deducts, the default front door"),
    ("peer_cost_per_million_deduct_usd", "goal 4: the same for the usual serverless deduct (REST + Lambda + DynamoDB)"),
    ("writer_vs_api_deduct_ratio", "goal 5: the writer's rows/s through the broker over the API's ASYNC deducts/s"),
    ("handler_vs_floor_instructions_ratio", "goal 6: instructions per deduct, the handler over the floor"),
]

COST_LINES = [
    ("api_gateway", "API Gateway"),
    ("api_function", "API function"),
    ("writer_function", "writer function"),
    ("msk_data", "MSK data"),
    ("aurora_io", "Aurora I/O"),
    ("dynamodb_writes", "DynamoDB writes"),
    ("logs", "CloudWatch Logs"),
    ("xray", "X-Ray"),
    ("total", "**total**"),
]


class NotAFullRun(ValueError):
    pass


def _number(value) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1000:
        return f"{int(value):,}"
    return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.1f}"


def _verdict(results: dict, name: str) -> str:
    target = results["targets"].get(name)
    if not target:
        return ""
    return f"{target['target']} ({'met' if target['met'] else 'NOT met'})"


def _baseline(results: dict, name: str) -> str:
    baseline = results["figures"][name]["baseline"]
    if not baseline:
        return ""
    entry = results["figures"].get(baseline)
    return f"`{baseline}` {_number(entry['value'])}" if entry else f"`{baseline}`"


def render(results: dict) -> str:
    """The generated part of docs/performance.md, from one full run's results."""
    if results.get("size") != "full" or results.get("stages_run") != "all":
        raise NotAFullRun(f"a {results.get('size')} run of stages {results.get('stages_run')}: not a full run")
    if results.get("stages_failed"):
        raise NotAFullRun(f"stages failed: {results['stages_failed']}")
    machine = results["machine"]
    figures = results["figures"]
    seconds = sum(results.get("stage_seconds", {}).values())
    out = [
        BEGIN,
        "",
        "## The last full run",
        "",
        f"`{results['command']}` (`make bench`), commit `{(results['commit'] or '')[:10]}`"
        f"{' with uncommitted changes' if results['dirty'] else ''}, finished {results['measured_at']}, "
        f"{_number(seconds)} s in all; {machine['cpus']} vCPUs, Python {machine['python']}, load average "
        f"{machine['load_average_before'][0]:.2f} before and {machine['load_average_after'][0]:.2f} after; "
        f"{results['client_concurrency']} client processes, {results['seconds_per_window']} s windows. Every figure "
        "below is this run's; each ratio's baseline was measured in the same run. Figures are never asserted in tests "
        "(the machine is shared); `make test` runs every stage at a tiny size (`make bench-smoke`) so that none rots.",
        "",
        "**Issue 33's goals:**",
        "",
        "| figure | what it says | measured | baseline (same run) | target |",
        "|---|---|---|---|---|",
    ]
    for name, what in GOALS:
        if name in figures:
            out.append(
                f"| `{name}` | {what} | **{_number(figures[name]['value'])}** | {_baseline(results, name)} | "
                f"{_verdict(results, name)} |"
            )
        else:
            out.append(f"| `{name}` | {what} | not measured | | |")
    cost = results.get("cost")
    if cost:
        doors = [door for door in ("http", "rest") if door in cost]
        out += [
            "",
            f"**Cost per million deducts**, USD, request-driven, list prices of {cost['prices_as_of']} "
            "(`bench/cost.py` names each; the stack's fixed monthly cost is in operations.md):",
            "",
            "| line | " + " | ".join(f"FrontDoor {door}" for door in doors) + " | the usual serverless deduct |",
            "|---|" + "---|" * (len(doors) + 1),
        ]
        for line, label in COST_LINES:
            cells = [cost[door]["deduct"].get(line) for door in doors] + [cost["peer_deduct"].get(line)]
            if all(cell is None for cell in cells):
                continue
            out.append(
                f"| {label} | "
                + " | ".join("" if c is None else f"{c:.2f}" if line == "total" else f"{c:.3f}" for c in cells)
                + " |"
            )
    out += [
        "",
        "**Every figure of the run** (`bench/results.json` has each one's samples and what it measures):",
        "",
        "| figure | value | unit | samples | baseline | target |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in figures.items():
        samples = "" if entry["samples"] is None else _number(entry["samples"])
        out.append(
            f"| `{name}` | {_number(entry['value'])} | {entry['unit']} | {samples} | "
            f"{('`' + entry['baseline'] + '`') if entry['baseline'] else ''} | {_verdict(results, name)} |"
        )
    out += ["", "**Each stage:** seconds it took, and the 1-minute load average as it began:", ""]
    out += ["| stage | seconds | load at start |", "|---|---|---|"]
    loads = results.get("stage_load_at_start", {})
    for stage, took in results.get("stage_seconds", {}).items():
        out.append(f"| {stage} | {_number(took)} | {_number(loads.get(stage))} |")
    out += ["", END]
    return "\n".join(out)


def replaced(doc: str, block: str) -> str:
    """The doc with its generated part replaced by block (markers included)."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC.name} has no generated part: the markers {BEGIN!r} and {END!r} are missing")
    return doc[:start] + block + doc[end + len(END) :]


def write(results: dict, doc: Path = DOC) -> None:
    doc.write_text(replaced(doc.read_text(), render(results)))


def main() -> int:
    try:
        write(json.loads(RESULTS.read_text()))
    except NotAFullRun as not_full:
        print(f"perfdoc: {RESULTS.name} is {not_full}; docs/performance.md left as it was", file=sys.stderr)
        return 1
    print(f"perfdoc: {DOC.relative_to(REPO)} written from {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
