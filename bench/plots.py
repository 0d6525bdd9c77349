"""PNG charts of a bench run, written next to bench/results.json: latency against offered rate (per route), throughput
per feature against its baseline, writer rows/s against partitions.

    PYTHONPATH=functions:. .venv/bin/python bench/plots.py [bench/results.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# feature figure -> its baseline figure (both in results["figures"])
PAIRS = [
    ("async_deduct_per_s", "sync_deduct_baseline_per_s", "hot-account deduct"),
    ("seckill_attempts_per_s", "seckill_db_attempts_per_s", "flash-sale order"),
    ("redpacket_grabs_per_s", "redpacket_seed_script_grabs_per_s", "red-packet grab script"),
    ("delay_drain_per_s", None, "delay-queue drain"),
]


def write(results: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {name: entry["value"] for name, entry in results["figures"].items()}
    written = []
    run = f"{(results.get('commit') or '')[:8]} {results.get('measured_at', '')}"

    latency = results.get("latency") or {}
    if latency:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for number, (route, found) in enumerate(latency.items()):
            steps = found["steps"]
            for q, style in (("p50_ms", "--"), ("p99_ms", "-")):
                points = [(s["offered_per_s"], s[q]) for s in steps if s[q] is not None]
                if points:
                    ax.plot(
                        *zip(*points, strict=False), style, marker="o", color=f"C{number}", label=f"{route} {q[:-3]}"
                    )
        ax.axhline(50, color="grey", linewidth=0.8, label="50 ms (the knee)")
        ax.set_xlabel("offered requests/s (open loop, HTTP)")
        ax.set_ylabel("latency ms")
        ax.set_yscale("log")
        ax.set_title(f"latency vs offered rate ({run})", fontsize=9)
        ax.legend(fontsize=7)
        written.append(_save(fig, out_dir / "latency.png"))

    bars = [(label, figures.get(f), figures.get(b) if b else None) for f, b, label in PAIRS if figures.get(f)]
    if bars:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = range(len(bars))
        ax.bar([x - 0.2 for x in xs], [v for _, v, _ in bars], 0.4, label="hotledger")
        ax.bar([x + 0.2 for x in xs], [b or 0 for _, _, b in bars], 0.4, label="baseline (same run)")
        ax.set_xticks(list(xs), [label for label, _, _ in bars], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("per second")
        ax.set_title(f"throughput against its baseline ({run})", fontsize=9)
        ax.legend(fontsize=8)
        written.append(_save(fig, out_dir / "throughput.png"))

    writer = results.get("writer") or {}
    if writer:
        parts = sorted(writer, key=int)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([int(p) for p in parts], [writer[p]["per_s"] or 0 for p in parts], marker="o", label="total")
        ax.plot(
            [int(p) for p in parts],
            [writer[p]["per_partition_per_s"] or 0 for p in parts],
            marker="o",
            label="per partition",
        )
        ax.set_xlabel("partitions (a poller and writer each)")
        ax.set_ylabel("rows/s persisted and settled")
        ax.set_title(f"writer on its real path ({run})", fontsize=9)
        ax.legend(fontsize=8)
        written.append(_save(fig, out_dir / "writer.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / "results.json"
    for written in write(json.loads(path.read_text()), path.parent):
        print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
