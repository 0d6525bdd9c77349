"""bench/stats.py and bench/report.py: the benchmarks' arithmetic and bookkeeping (never a figure's value: figures are
never asserted)."""

from __future__ import annotations

import io
import os
import signal

import pytest

from bench import report, stats


def test_a_percentile_needs_enough_samples_to_exist():
    assert stats.percentile(list(range(99)), 0.99) is None  # 99 samples: no p99, not the maximum passed off as one
    assert stats.percentile(list(range(1, 101)), 0.99) == 99
    assert stats.percentile(list(range(1, 1001)), 0.999) == 999
    assert stats.percentile(list(range(1, 1000)), 0.999) is None
    assert stats.percentile([5.0, 1.0, 3.0], 0.5) == 3.0


def test_only_samples_started_in_the_window_count():
    samples = [(0.5, 10.0), (1.0, 20.0), (2.5, 30.0), (3.0, 40.0)]
    assert stats.in_window(samples, 1.0, 3.0) == [(1.0, 20.0), (2.5, 30.0)]


def test_a_rate_is_over_its_window():
    assert stats.rate(300, 10.0, 13.0) == 100.0
    with pytest.raises(ValueError):
        stats.rate(1, 5.0, 5.0)


def test_the_knee_is_the_lowest_offered_rate_past_the_limit():
    assert stats.knee([(400, 80.0), (100, 12.0), (200, 49.0)]) == 400
    assert stats.knee([(100, 12.0), (200, None)]) == 200  # every request of a step failed: past it
    assert stats.knee([(100, 12.0), (200, 30.0)]) is None  # above the range tried


def test_entities_per_gib_and_ratios():
    assert stats.per_gib(1024) == 1 << 20
    with pytest.raises(ValueError):
        stats.per_gib(0)
    assert stats.ratio(10, 4) == 2.5
    assert stats.ratio(None, 4) is None and stats.ratio(3, 0) is None


def test_figures_carry_unit_samples_and_baseline_and_are_recorded_once():
    figures = report.Figures()
    figures.add("a_per_s", 10.0, "1/s", samples=100, baseline="b_per_s", measures="a")
    assert figures.entries["a_per_s"] == {
        "value": 10.0,
        "unit": "1/s",
        "samples": 100,
        "baseline": "b_per_s",
        "measures": "a",
    }
    assert figures.values() == {"a_per_s": 10.0}
    with pytest.raises(KeyError):
        figures.add("a_per_s", 11.0, "1/s")


def test_a_figure_not_measured_has_not_met_its_target():
    verdicts = report.target_verdicts(
        {"x": 5, "y": None, "z": 1}, {"x": (">=", 5), "y": ("<=", 1), "z": ("<=", 0), "w": (">=", 1)}
    )
    assert verdicts == {
        "x": {"target": ">= 5", "met": True},
        "y": {"target": "<= 1", "met": False},
        "z": {"target": "<= 0", "met": False},
    }


def test_progress_prints_a_line_per_stage_and_times_them():
    out = io.StringIO()
    progress = report.Progress(2, stream=out)
    progress.stage("first")
    progress.stage("second")
    took = progress.finish()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("bench [1/2] first") and lines[1].startswith("bench [2/2] second")
    assert set(took) == {"first", "second"}


def test_the_machine_and_commit_are_recorded():
    assert len(report.machine()["load_average"]) == 3
    assert set(report.commit()) == {"commit", "dirty"}


def test_cost_per_million_adds_its_lines_from_named_prices():
    from bench import cost

    args = dict(api_ms=20.0, api_gb=0.5, log_bytes=800, writer_s_per_row=0.001, writer_gb=0.5, rows=2, events=2)
    lines = cost.per_million("http", **args, platform_log_bytes=0, xray_sampled=0.0)
    assert lines["api_gateway"] == cost.HTTP_API_PER_MILLION
    assert lines["api_function"] == round(
        cost.LAMBDA_PER_MILLION_REQUESTS + 1e6 * 0.5 * 0.02 * cost.LAMBDA_ARM_PER_GB_S, 3
    )
    assert lines["writer_function"] == round(1e6 * 2 * 0.001 * 0.5 * cost.LAMBDA_ARM_PER_GB_S, 3)
    assert lines["logs"] == round((800 + cost.ACCESS_LOG_BYTES["http"]) / 1000 * cost.CLOUDWATCH_LOGS_PER_GB, 3)
    assert lines["xray"] == 0
    assert lines["total"] == round(sum(v for k, v in lines.items() if k != "total"), 2)
    rest = cost.per_million("rest", **args, platform_log_bytes=330, xray_sampled=0.0)
    assert rest["api_gateway"] == cost.REST_API_PER_MILLION and rest["xray"] == 0.25  # its stage samples
    assert cost.peer_per_million(800, 0.5)["dynamodb_writes"] == cost.PEER_DEDUCT_WRU * cost.DYNAMODB_PER_MILLION_WRU


def test_the_headline_cost_is_priced_behind_the_templates_default_front_door(tmp_path):
    from bench import cost

    assert cost.default_front_door() == "http"
    template = (cost.REPO / "template.yaml").read_text()
    changed = tmp_path / "template.yaml"
    changed.write_text(
        template.replace(
            "FrontDoor:\n    Type: String\n    Default: http", "FrontDoor:\n    Type: String\n    Default: rest"
        )
    )
    assert cost.default_front_door(changed) == "rest"


def test_the_api_function_is_billed_for_its_cpu_at_its_share_of_a_vcpu_plus_the_waits():
    from bench import cost

    # 512 MB is 0.289 of a vCPU: 1 ms of CPU takes 3.46 ms, plus 3.5 ms of waits, rounded up to Lambda's 1 ms
    assert cost.billed_ms(1000, 0.5) == 7
    assert cost.billed_ms(0, 0.5) == 4


def test_the_cost_follows_the_templates_logging_and_tracing_of_the_api_function():
    from bench import cost

    # the template leaves out Lambda's platform lines (SystemLogLevel WARN) and traces only what was sampled upstream
    assert cost.api_function_observability() == (0, 0.0)

    assert cost.template_memory_gb("ApiFunction") > 0


def test_the_writer_is_set_against_the_api_only_when_the_run_measured_both():
    from bench import run

    both = report.Figures()
    for name, value in (
        ("async_deduct_per_s", 1_400.0),
        ("async_deduct_per_cpu_s", 2_000.0),
        ("writer_rows_per_s", 5_600.0),
        ("writer_rows_per_cpu_s", 9_000.0),
    ):
        both.add(name, value, "1/s")
    run.writer_vs_api_figures(both)
    assert both.entries["writer_vs_api_deduct_ratio"]["value"] == 4.0
    assert both.entries["writer_vs_api_deduct_ratio"]["baseline"] == "async_deduct_per_s"
    assert both.entries["writer_vs_api_rows_per_cpu_s_ratio"]["value"] == 4.5
    writer_only = report.Figures()  # `--only 5`: no API figure, no ratio
    writer_only.add("writer_rows_per_s", 5_600.0, "1/s")
    run.writer_vs_api_figures(writer_only)
    assert list(writer_only.entries) == ["writer_rows_per_s"]


def test_a_process_trees_cpu_counts_its_live_descendants():
    import subprocess
    import sys
    import time

    from bench import writer_speed

    # a process that burns 0.2 s of CPU, and a child of it that does too, both then alive until killed: 0.4 s in all
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
    child = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {burn + 'time.sleep(30)'!r}])\n"
    parent = subprocess.Popen([sys.executable, "-c", child + burn + "time.sleep(30)"], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while writer_speed.tree_cpu_s(parent.pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert writer_speed.tree_cpu_s(parent.pid) >= 0.4
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
