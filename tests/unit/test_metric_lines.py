"""The service's EMF lines (hotledger.observability.CountsFirst: counts added without generic validation, an
invocation of counts under the service dimension written from a template) are Powertools' lines, byte for byte."""

import contextlib
import io
import json
import re

import pytest
from aws_lambda_powertools.metrics import MetricResolution, MetricUnit
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

from hotledger import observability

STAMP = r'"Timestamp": ?\d+'  # Powertools writes the lines it flushes at its limits with spaces


def count(name, value=1):
    return lambda m: m.add_metric(name=name, unit=MetricUnit.Count, value=value)


# each: what an invocation adds, and whether its line comes from the template: counts (whatever added them) of
# standard resolution under the service dimension only
INVOCATIONS = [
    ([count("ApiRequests"), count("Deducts")], True),
    ([count("ApiRequests")], True),
    ([count("ApiRequests"), count("ApiRequests"), count("Grabs", 3)], True),
    ([count("Big", 2**40), count("with%percent"), count('quote"d')], True),
    ([lambda m: m.add_dimension(name="service", value="svc"), count("ApiRequests")], True),
    ([count("ApiRequests"), lambda m: m.add_metric(name="Latency", unit=MetricUnit.Milliseconds, value=3.5)], False),
    ([count("ApiRequests"), lambda m: m.add_metric(name="Fine", unit=MetricUnit.Count, value=1.5)], True),
    ([lambda m: m.add_metric(name="Hi", unit=MetricUnit.Count, value=1, resolution=MetricResolution.High)], False),
    ([count("ApiRequests"), lambda m: m.add_dimension(name="code", value="X")], False),
    ([count("ApiRequests"), lambda m: m.add_metadata(key="entry", value="123")], False),
    ([count("ApiRequests"), lambda m: m.add_dimensions(route="deduct")], False),
    ([count("ApiRequests"), lambda m: m.set_timestamp(1_700_000_000_000)], False),
    ([lambda m: m.add_metric(name="ApiRequests", unit="Count", value=1)], True),
    # values the encoder spells otherwise than their repr (NaN, Infinity) or that are no float
    ([count("ApiRequests"), lambda m: m.add_metric(name="Odd", unit=MetricUnit.Count, value=float("nan"))], True),
    ([count("ApiRequests"), lambda m: m.add_metric(name="Odd", unit=MetricUnit.Count, value=float("-inf"))], True),
    ([count("ApiRequests"), lambda m: m.metric_set["ApiRequests"]["Value"].append(True)], True),
    ([count("ApiRequests"), lambda m: m.metric_set["ApiRequests"]["Value"].append(7)], True),
]


def _flushed(provider, adds) -> tuple[str, bool]:
    """The line the provider prints for one invocation, and whether it came from the template."""
    templated = []
    if isinstance(provider, observability.CountsFirst):
        real = provider._counts_line
        provider._counts_line = lambda: templated.append(real()) or templated[-1]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for add in adds:
            add(provider)
        provider.flush_metrics()
    return out.getvalue(), bool(templated and templated[0])


@pytest.mark.parametrize("adds, templated", INVOCATIONS)
def test_an_invocations_emf_line_is_powertools_line(adds, templated):
    ours, default = (
        observability.CountsFirst(namespace="Ns", service="svc"),
        AmazonCloudWatchEMFProvider(namespace="Ns", service="svc"),
    )
    for _ in range(2):  # the second invocation: after clear_metrics, from the cached template
        our_line, from_template = _flushed(ours, adds)
        default_line = _flushed(default, adds)[0]
        assert json.loads(our_line)["_aws"]["Timestamp"] > 0
        assert re.sub(STAMP, "", our_line) == re.sub(STAMP, "", default_line) and our_line.count("\n") == 1
        assert from_template is templated


def test_counts_past_the_emf_limits_are_flushed_as_powertools_flushes_them():
    ours, default = (
        observability.CountsFirst(namespace="Ns", service="svc"),
        AmazonCloudWatchEMFProvider(namespace="Ns", service="svc"),
    )
    adds = [count(f"M{i}") for i in range(120)] + [count("M0") for _ in range(150)]
    lines = [_flushed(provider, adds)[0] for provider in (ours, default)]
    assert re.sub(STAMP, "", lines[0]) == re.sub(STAMP, "", lines[1]) and lines[0].count("\n") >= 3


def test_metrics_disabled_write_nothing_and_keep_nothing_across_invocations(monkeypatch):
    """POWERTOOLS_METRICS_DISABLED: Powertools' flush then neither writes nor clears, so the counts pile up across
    invocations until its 100-value limit prints them in one line anyway, stamped with the time of that flush."""
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    metrics = observability.metrics()
    logger = observability.ServiceLogger(service="svc", level="WARNING")
    handler = observability.invocation(logger, metrics)(
        lambda event, context: count("ApiRequests")(metrics) or count("Deducts")(metrics)
    )
    context = type("Context", (), {"function_name": "F", "memory_limit_in_mb": 128, "invoked_function_arn": "arn"})()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for n in range(150):
            context.aws_request_id = f"req-{n}"
            handler({}, context)
            assert not metrics.metric_set, n
    assert out.getvalue() == ""
