"""bench/perfdoc.py: docs/performance.md quotes one full `make bench` run, the one in bench/results.json, and only a
full run that failed no stage may be written there."""

from __future__ import annotations

import copy
import json

import pytest

from bench import perfdoc


def _run(**changes) -> dict:
    results = {
        "command": "bench/run.py",
        "stages_run": "all",
        "stages_failed": [],
        "commit": "0123456789abcdef",
        "dirty": False,
        "measured_at": "2026-11-29T02:00:00Z",
        "machine": {"cpus": 2, "python": "3.11.7", "load_average_before": [0.3], "load_average_after": [1.5]},
        "client_concurrency": 8,
        "seconds_per_window": 10,
        "size": "full",
        "targets": {"hot_account_ceiling_ratio": {"target": ">= 20", "met": True}},
        "figures": {
            "hot_account_db_us_per_deduct": {"value": 866.0, "unit": "us", "samples": 10016, "baseline": None},
            "redis_thread_usec_per_deduct": {"value": 40.4, "unit": "us", "samples": 200000, "baseline": None},
            "hot_account_ceiling_ratio": {
                "value": 21.5,
                "unit": "ratio",
                "samples": None,
                "baseline": "redis_thread_usec_per_deduct",
            },
        },
        "stage_seconds": {"hot path CPU": 120.5, "Redis ceiling": 60.0},
        "stage_load_at_start": {"hot path CPU": 0.3, "Redis ceiling": 2.1},
    }
    results.update(changes)
    return results


def test_the_goals_lead_with_their_measured_value_baseline_and_verdict():
    block = perfdoc.render(_run())
    assert block.startswith(perfdoc.BEGIN) and block.endswith(perfdoc.END)
    goal = next(line for line in block.splitlines() if line.startswith("| `hot_account_ceiling_ratio` |"))
    assert "**21.5**" in goal and "`redis_thread_usec_per_deduct` 40.4" in goal and ">= 20 (met)" in goal
    # a goal this run did not measure says so rather than vanishing
    assert "| `sync_vs_lean_ratio` |" in block and "not measured" in block
    assert "| Redis ceiling | 60 | 2.1 |" in block
    assert "commit `0123456789`" in block and "uncommitted" not in block


@pytest.mark.parametrize(
    "partial",
    [{"size": "quick"}, {"size": "smoke"}, {"stages_run": [1, 15]}, {"stages_failed": ["writer"]}],
)
def test_a_partial_or_failed_run_is_never_written_into_the_doc(partial):
    with pytest.raises(perfdoc.NotAFullRun):
        perfdoc.render(_run(**partial))


def test_only_the_part_between_the_markers_is_rewritten():
    doc = f"# Performance\n\nprose before\n\n{perfdoc.BEGIN}\nold figures\n{perfdoc.END}\n\nprose after\n"
    once = perfdoc.replaced(doc, perfdoc.render(_run()))
    assert once.startswith("# Performance\n\nprose before\n\n") and once.endswith("\n\nprose after\n")
    assert "old figures" not in once
    assert perfdoc.replaced(once, perfdoc.render(_run())) == once
    with pytest.raises(ValueError):
        perfdoc.replaced("# no markers\n", perfdoc.render(_run()))


def test_the_doc_quotes_the_full_run_of_record():
    """docs/performance.md's figures are exactly bench/results.json's: a doc edited by hand, or a results file
    replaced by a partial run, fails here (`make bench` writes both)."""
    results = json.loads(perfdoc.RESULTS.read_text())
    assert perfdoc.render(copy.deepcopy(results)) in perfdoc.DOC.read_text()
