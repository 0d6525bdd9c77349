"""observability.invocation is `@logger.inject_lambda_context(clear_state=True)` over `@metrics.log_metrics`: the same
invocations through either write the same log and EMF lines, field for field, a cold start, an invocation that
raises, keys left behind by the last one and all."""

import contextlib
import io
import json
import logging
import re
import uuid

import pytest
from aws_lambda_powertools import Metrics
from aws_lambda_powertools.logging import logger as powertools_logger
from aws_lambda_powertools.metrics import MetricUnit

from hotledger import observability


class _Context:
    function_name, memory_limit_in_mb = "ApiFunction", 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:1:function:ApiFunction"

    def __init__(self, request_id: str):
        self.aws_request_id = request_id


def _work(logger, metrics, event):
    """What one invocation logs and counts; the keys it appends outlive it unless the wrapper clears them."""
    logger.info("start")
    logger.set_correlation_id(event.get("correlation"))
    logger.append_keys(tenant=event["tenant"])
    logger.thread_safe_append_keys(part=event["tenant"])
    metrics.add_metric(name="ApiRequests", unit=MetricUnit.Count, value=1)
    logger.info("deducted", extra={"user_id": 5, "amount_minor": 1})
    if event.get("fail"):
        raise ValueError("boom")
    return {"statusCode": 200}


EVENTS = [
    {"tenant": "a", "correlation": "c-1"},
    {"tenant": "b"},
    {"tenant": "c", "correlation": "c-3", "fail": True},
    {"tenant": "d", "correlation": "c-4"},
]


def _lines(wrap, monkeypatch) -> list[str]:
    """Every line the invocations of EVENTS write through a handler wrapped by wrap(logger, metrics), in order;
    timestamps and the (per-run) service name left out."""
    monkeypatch.setattr(powertools_logger, "is_cold_start", True)
    stream = io.StringIO()
    service = f"inv-{uuid.uuid4().hex[:8]}"  # a service's logger is configured once per process: a fresh one
    logger = observability.ServiceLogger(service=service, level="INFO", logger_handler=logging.StreamHandler(stream))
    logger._logger.propagate = False
    metrics = Metrics(namespace="Ns", service=service)
    handler = wrap(logger, metrics)(lambda event, context: _work(logger, metrics, event))
    with contextlib.redirect_stdout(stream):
        for n, event in enumerate(EVENTS):
            with contextlib.suppress(ValueError):
                handler(event, _Context(f"req-{n}"))
    lines = stream.getvalue().splitlines()
    metrics.clear_metrics()
    masked = (('"timestamp":"[^"]*"', '"timestamp":"T"'), (r'"Timestamp":\s*\d+', '"Timestamp":0'), (service, "S"))
    for pattern, value in masked:
        lines = [re.sub(pattern, value, line) for line in lines]
    return lines


def _powertools(logger, metrics):
    return lambda handler: logger.inject_lambda_context(metrics.log_metrics(handler), clear_state=True)


def test_an_invocation_writes_what_powertools_decorators_write(monkeypatch):
    ours, theirs = _lines(observability.invocation, monkeypatch), _lines(_powertools, monkeypatch)
    assert ours == theirs
    logs = [json.loads(line) for line in ours if '"level"' in line]
    assert [line["cold_start"] for line in logs] == [True, True, False, False, False, False, False, False]
    assert [line["function_request_id"] for line in logs[::2]] == ["req-0", "req-1", "req-2", "req-3"]
    assert sum('"ApiRequests"' in line for line in ours) == 4  # the failed invocation's metrics flushed too


@pytest.mark.parametrize("variable", ["POWERTOOLS_LOGGER_LOG_EVENT", "POWERTOOLS_LOGGER_SAMPLE_RATE"])
def test_a_logger_that_logs_events_or_samples_takes_powertools_decorators(variable, monkeypatch):
    monkeypatch.setenv(variable, "true" if variable.endswith("EVENT") else "1")
    stream = io.StringIO()
    logger = observability.ServiceLogger(
        service=f"inv-{uuid.uuid4().hex[:8]}", level="INFO", logger_handler=logging.StreamHandler(stream)
    )
    logger._logger.propagate = False
    wrapped = observability.invocation(logger, Metrics(namespace="Ns"))(lambda event, context: None)
    assert wrapped.__code__.co_name == "decorate"  # Powertools' inject_lambda_context
    with contextlib.redirect_stdout(io.StringIO()):
        wrapped({"logged": "event"}, _Context("req-1"))
    assert ('"logged":"event"' in stream.getvalue()) is variable.endswith("EVENT")
