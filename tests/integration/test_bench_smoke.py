"""The bench cannot rot: `make test` runs every stage of bench/run.py once at a tiny size through its real entry point
(`--smoke`, as `make bench-smoke` does): each stage on a Redis, schema and topic of its own, no target judged, its
figures in a scratch file. A stage that raises fails this test with its traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import run as bench_run

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_every_bench_stage_runs_once_at_a_tiny_size(tmp_path):
    out, full_results = tmp_path / "results.json", REPO / "bench" / "results.json"
    before = full_results.stat().st_mtime_ns if full_results.exists() else None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "functions"), str(REPO)])}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--smoke", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, f"bench/run.py --smoke exited {done.returncode}:\n{done.stderr[-20000:]}"
    results = json.loads(out.read_text())
    assert results["size"] == "smoke"
    assert results["stages_failed"] == []
    assert list(results["stage_seconds"]) == bench_run.STAGES  # every stage ran, in order
    assert results["targets"] == {}  # nothing judged at this size
    assert results["figures"]
    assert "sync_vs_lean_ratio" in results["figures"]  # issue 33 goal 3: the SYNC path against the lean DB baseline
    assert (full_results.stat().st_mtime_ns if full_results.exists() else None) == before  # make bench's, untouched
