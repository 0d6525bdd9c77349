"""What bench/run.py records with every figure: its unit, how many samples it rests on, its baseline (the figure it is
compared with, measured in the same run), what it measures; the run's commit and machine (cores, load average
before and after); one progress line per stage on stderr. Tested in tests/unit/test_bench_stats.py."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class Figures:
    """name -> {value, unit, samples, baseline, measures}. A figure with a baseline names it; a ratio's baseline is
    its denominator. Values are never checked here: targets are compared when the results are written."""

    def __init__(self):
        self.entries: dict[str, dict] = {}

    def add(
        self, name: str, value, unit: str, samples: int | None = None, baseline: str | None = None, measures: str = ""
    ) -> None:
        if name in self.entries:
            raise KeyError(f"figure {name} recorded twice")
        self.entries[name] = {
            "value": value,
            "unit": unit,
            "samples": samples,
            "baseline": baseline,
            "measures": measures,
        }

    def value(self, name: str):
        return self.entries[name]["value"]

    def values(self) -> dict:
        return {name: entry["value"] for name, entry in self.entries.items()}


def target_verdicts(figures: dict, targets: dict) -> dict:
    """{name: {target, met}} for the targets whose figure was measured; a figure that is None (not measured, or too
    few samples) has not met its target."""
    verdicts = {}
    for name, (op, bound) in targets.items():
        if name not in figures:
            continue
        value = figures[name]
        met = value is not None and (value >= bound if op == ">=" else value <= bound)
        verdicts[name] = {"target": f"{op} {bound}", "met": met}
    return verdicts


def commit() -> dict:
    """The commit measured, and whether the work tree differed from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()),
    }


class Progress:
    """One line per stage on stderr: its number, name, and the time the run and the last stage took."""

    def __init__(self, stages: int, stream=None):
        self.stages, self.done, self.started = stages, 0, time.monotonic()
        self.stage_started = self.started
        self.stream = stream or sys.stderr
        self.took: dict[str, float] = {}
        self.load_at_start: dict[str, float] = {}  # the 1-minute load average as each stage began
        self.current: str | None = None

    def stage(self, name: str) -> None:
        now = time.monotonic()
        if self.current is not None:
            self.took[self.current] = round(now - self.stage_started, 1)
        self.done += 1
        self.current, self.stage_started = name, now
        self.load_at_start[name] = round(os.getloadavg()[0], 2)
        print(
            f"bench [{self.done}/{self.stages}] {name} (at {now - self.started:.0f} s; load {self.load_at_start[name]:.2f})",
            file=self.stream,
            flush=True,
        )

    def finish(self) -> dict:
        if self.current is not None:
            self.took[self.current] = round(time.monotonic() - self.stage_started, 1)
            self.current = None
        print(f"bench: done in {time.monotonic() - self.started:.0f} s", file=self.stream, flush=True)
        return self.took
