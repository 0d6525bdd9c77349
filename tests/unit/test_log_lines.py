"""The service's log lines are Powertools' default lines, field for field: hotledger.observability.logger's (one
shared encoder, no JSON decode attempt for a message that cannot be JSON), and ServiceLogger's plain INFO lines,
written without a LogRecord."""

import io
import logging
import re
import uuid

import pytest
from aws_lambda_powertools import Logger

from hotledger import observability

MESSAGES = [
    "deducted",
    '{"code": "X", "n": 1}',
    "[1, 2]",
    "123",
    " true",
    "null",
    "NaN",
    "-5",
    '"quoted"',
    "{not json",
    "ünïcode €",
    "",
]


def _lines(name: str, **options) -> list[str]:
    """The lines a Logger with these options writes for MESSAGES, as written (timestamps and the logger's name left
    out)."""
    stream = io.StringIO()
    logger = Logger(service=name, level="INFO", logger_handler=logging.StreamHandler(stream), **options)
    for message in MESSAGES:
        logger.info(message, extra={"user_id": 5, "entry_id": "123", "raw": b"x"})
    return [re.sub(r'"(timestamp|service)":"[^"]*"', "", line) for line in stream.getvalue().splitlines()]


def test_the_service_logger_writes_powertools_default_lines():
    formatter = observability.logger().registered_formatter
    ours = _lines("ours", json_serializer=formatter.json_serializer, json_deserializer=formatter.json_deserializer)
    assert len(ours) == len(MESSAGES) and ours == _lines("powertools-default")


def _service_and_default(name: str, level: str = "INFO"):
    """A ServiceLogger and a Powertools Logger with the same options, each writing to its own stream, both kept from
    the loggers above (pytest captures the root's records: a record made for it would be Powertools' way)."""
    made = []
    formatter = observability.logger().registered_formatter
    options = {"json_serializer": formatter.json_serializer, "json_deserializer": formatter.json_deserializer}
    name = f"{name}-{uuid.uuid4().hex[:8]}"  # a service's logger is configured once per process: a fresh one
    for cls, service in ((observability.ServiceLogger, f"{name}-ours"), (Logger, f"{name}-default")):
        stream = io.StringIO()
        logger = cls(service=service, level=level, logger_handler=logging.StreamHandler(stream), **options)
        logger._logger.propagate = False
        made.append((logger, stream))
    return made


def _emit(logger, message, **options):
    logger.info(message, **options)  # one line: both loggers' lines name the same location


class _Context:
    function_name, memory_limit_in_mb = "ApiFunction", 512
    invoked_function_arn, aws_request_id = "arn:aws:lambda:us-east-1:1:function:ApiFunction", "req-1"


CALLS = [
    ("deducted", {"extra": {"user_id": 5, "entry_id": "123", "amount_minor": 1, "mode": "ASYNC"}}),
    ("ünïcode €", {"extra": {"raw": b"x", "none": None, "nested": {"a": [1, 2]}}}),
    ("no extra", {}),
    ("", {}),
    ('{"code": "X"}', {}),  # JSON text: Powertools decodes it
    ("%s and %s", {"args": None}),  # placeholders without arguments
    ("with an exception", {"exc_info": ValueError("boom")}),
    ("service in extra", {"extra": {"service": "overridden", "correlation_id": None}}),
]


@pytest.mark.parametrize("message, options", CALLS)
def test_a_service_loggers_info_line_is_powertools_line(message, options, monkeypatch):
    (ours, our_stream), (default, default_stream) = _service_and_default("same")
    plain = []
    real_plain_line = observability.ServiceLogger._plain_line
    monkeypatch.setattr(
        observability.ServiceLogger,
        "_plain_line",
        lambda self, *args: plain.append(real_plain_line(self, *args)) or plain[-1],
    )
    options = {k: v for k, v in options.items() if k != "args"}
    for logger in (ours, default):
        logger.structure_logs(cold_start=False, **_lambda_keys())
        logger.set_correlation_id("corr-1")
        logger.append_keys(tenant="t1", dropped=None)
        logger.thread_safe_append_keys(request_part="p1")
        _emit(logger, message, **options)
        logger.thread_safe_clear_keys()
    ours_line, default_line = our_stream.getvalue(), default_stream.getvalue()
    assert re.search(r'"timestamp":"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}[+-]\d{4}"', ours_line)
    same = [re.sub(r'"(timestamp|service)":"[^"]*"', "", line) for line in (ours_line, default_line)]
    assert same[0] == same[1] and same[0].count("\n") == 1
    # the plain lines were written without a LogRecord; a message that may be JSON text and a call with more than
    # extra fields went Powertools' way
    may_be_json = bool(message) and message[0] in observability._JSON_STARTS
    assert plain == ([] if "exc_info" in options else [not may_be_json])


def _lambda_keys() -> dict:
    context = _Context()
    return {
        "function_name": context.function_name,
        "function_memory_size": context.memory_limit_in_mb,
        "function_arn": context.invoked_function_arn,
        "function_request_id": context.aws_request_id,
    }


def test_a_service_logger_below_info_writes_nothing_and_a_propagating_record_is_made(monkeypatch):
    (quiet, quiet_stream), _ = _service_and_default("quiet", level="WARNING")
    _emit(quiet, "deducted", extra={"user_id": 5})
    assert quiet_stream.getvalue() == ""
    (ours, our_stream), _ = _service_and_default("captured")
    ours._logger.propagate = True  # pytest's handler on the root would see the record: Powertools' way
    records = []
    monkeypatch.setattr(logging.Logger, "handle", lambda self, record: records.append(record))
    _emit(ours, "deducted", extra={"user_id": 5})
    assert [r.getMessage() for r in records] == ["deducted"] and records[0].funcName == "_emit"


@pytest.mark.parametrize("utc", [False, True])
def test_a_plain_lines_timestamp_is_the_formatters_formatTime(utc, monkeypatch):
    ours = observability.ServiceLogger(service=f"stamp-{uuid.uuid4().hex[:8]}", utc=utc)
    formatter = ours.registered_formatter
    moments_ns = [
        1_700_000_000_000_000_000,
        1_700_000_000_999_000_000,
        1_700_000_001_000_000_000,
        1_711_846_799_123_456_789,
    ]
    for now_ns in moments_ns:
        monkeypatch.setattr(observability.time, "time_ns", lambda now_ns=now_ns: now_ns)
        record = logging.makeLogRecord({"created": now_ns / 1e9, "msecs": float(now_ns // 1_000_000 % 1000)})
        assert ours._timestamp(formatter) == formatter.formatTime(record)


class _Unbuffered:
    """A stream as Lambda's runtime wraps stdout (awslambdaric's Unbuffered): flush found through __getattr__."""

    def __init__(self, calls: list) -> None:
        self.stream, self.calls = io.StringIO(), calls

    def write(self, text: str) -> int:
        self.calls.append("write")
        return self.stream.write(text)

    def __getattr__(self, name: str):
        if name == "flush":
            return lambda: self.calls.append("flush")
        return getattr(self.stream, name)


def test_a_plain_line_is_written_and_flushed_as_powertools_writes_it():
    made = []
    for cls in (observability.ServiceLogger, Logger):
        calls: list = []
        stream = _Unbuffered(calls)
        handler = logging.StreamHandler(stream)  # type: ignore[arg-type]
        logger = cls(service=f"flushed-{uuid.uuid4().hex[:8]}", level="INFO", logger_handler=handler)
        logger._logger.propagate = False
        for _ in range(3):
            _emit(logger, "deducted", extra={"user_id": 5})
        made.append((calls, stream.stream.getvalue().count("\n")))
    assert made[0] == made[1] and made[0][1] == 3


def test_the_log_line_json_is_the_encoders_with_or_without_the_c_accelerator(monkeypatch):
    line = {"message": "ünïcode €", "n": 1, "f": 1.5, "nan": float("nan"), "raw": b"x", "nested": {"a": [1, None]}}
    expected = observability._LOG_LINE.encode(line)
    assert observability._log_line_json(line) == expected
    monkeypatch.setattr(observability, "c_make_encoder", None)
    assert observability._log_line_json(line) == expected
