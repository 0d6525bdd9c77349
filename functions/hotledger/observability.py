"""Powertools Logger, Metrics and Tracer with the service's defaults (env vars still override them).

Each charge writes one log line and one EMF line. Powertools builds both generically: a LogRecord with the caller
found by walking the stack, the record's attributes copied and filtered, the message tried as JSON; every metric
validated and debug-formatted, the EMF document built and serialized afresh. For the plain cases (an INFO line of a
text message with plain extra fields; counts of standard resolution under the service dimension) the lines are
written here from the same state with less work: the same lines, field for field (tests/unit/test_log_lines.py,
tests/unit/test_metric_lines.py). Anything else takes Powertools' own way."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, TypeVar, cast

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging import logger as powertools_logger
from aws_lambda_powertools.logging.filters import SuppressFilter
from aws_lambda_powertools.logging.formatter import RESERVED_LOG_ATTRS, LambdaPowertoolsFormatter
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.constants import MAX_METRIC_NAME_LENGTH, MAX_METRICS
from aws_lambda_powertools.shared import constants as powertools_constants
from aws_lambda_powertools.shared.functions import (
    is_durable_context,
    powertools_dev_is_set,
    resolve_truthy_env_var_choice,
)

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "hotledger")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Hotledger")


# one encoder for every log line (Powertools' default serializer, json.dumps with these options, makes one per line)
_LOG_LINE = json.JSONEncoder(default=str, separators=(",", ":"), ensure_ascii=False)


def _log_line_json(line: object) -> str:
    """_LOG_LINE.encode(line): what it runs, its C encoder made with the same options, without the Python frames of
    encode and iterencode around it (a fresh circular-reference record per line, as there)."""
    if c_make_encoder is None:  # an interpreter without the C accelerator
        return _LOG_LINE.encode(line)
    return "".join(c_make_encoder({}, str, encode_basestring, None, ":", ",", False, False, True)(line, 0))


_JSON_STARTS = frozenset('{["-0123456789tfnNI \t\n\r')


def _message_as_json(message: str) -> Any:
    """Powertools decodes a message that is JSON text into the line's object; a message that cannot be JSON (most:
    "deducted") is refused here without raising out of the JSON decoder."""
    if not message or message[0] not in _JSON_STARTS:
        raise ValueError("not JSON")
    return json.loads(message)


# the record attributes Powertools fills placeholders of (a set: looked up for every key of every line)
_RESERVED = frozenset(RESERVED_LOG_ATTRS)
# keys Powertools sets after the extra fields (from the record; None without an exception: left out)
_NOT_EXTRA = frozenset(
    {*RESERVED_LOG_ATTRS, "message", "exception", "exception_name", "exception_notes", "stack_trace", "xray_trace_id"}
)


def _trace_id(formatter: LambdaPowertoolsFormatter) -> str | None:
    """The line's xray_trace_id as the formatter sets it: the Root of the invocation's trace header, None when the
    logger was made with xray_trace_id=None (the key then names None) or there is no header."""
    if formatter.log_format.get("xray_trace_id", "") is None:
        return None
    header = os.environ.get(powertools_constants.XRAY_TRACE_ID_ENV)
    return header.split(";")[0].replace("Root=", "") if header else None


_DEFAULT_TIME_FORMAT = "%Y-%m-%d %H:%M:%S,%F%z"  # LambdaPowertoolsFormatter's: 2021-05-03 10:20:19,650+0200


class _Stamp:
    """What the formatter's formatTime reads of a record."""

    __slots__ = ("created", "msecs")

    def __init__(self) -> None:
        now_ns = time.time_ns()
        self.created = now_ns / 1e9
        self.msecs = float((now_ns % 1_000_000_000) // 1_000_000)


class ServiceLogger(Logger):
    """Powertools' Logger; `info` of a plain line (a text message, plain extra fields) is written without a LogRecord."""

    def info(  # Powertools' parameters; only a plain call takes the short way
        self, msg: object, *args: object, extra: Mapping[str, object] | None = None, **kwargs: Any
    ) -> None:
        if args or kwargs or not isinstance(msg, str) or not self._plain_line(msg, extra, sys._getframe(1)):
            # one frame more than a direct call: the line's location is still the caller's
            kwargs["stacklevel"] = cast(int, kwargs.get("stacklevel", 2)) + 1
            super().info(msg, *args, extra=extra, **kwargs)

    def _plain_line(self, message: str, extra: Mapping[str, object] | None, caller: Any) -> bool:
        """Writes the line Powertools would write and says True, or writes nothing and says False."""
        logger = self._logger
        if self._buffer_config or logger.filters or not self._only_own_handler_writes():
            return False
        if not logger.isEnabledFor(logging.INFO):
            return True  # no line at all, as Powertools would write none
        if message and message[0] in _JSON_STARTS:
            return False  # it may be JSON: Powertools decodes it
        handler = self.registered_handler
        formatter = handler.formatter
        if (
            type(handler) is not logging.StreamHandler
            or handler.filters
            or handler.level > logging.INFO
            or type(formatter) is not LambdaPowertoolsFormatter
        ):
            return False
        line: dict[str, Any] = {}
        for keys in (formatter.log_format, formatter.thread_safe_get_current_keys()):
            for key, value in keys.items():
                if value and key in _RESERVED:
                    if value == "%(levelname)s":
                        value = "INFO"
                    elif value == "%(funcName)s:%(lineno)d":
                        value = f"{caller.f_code.co_name}:{caller.f_lineno}"
                    elif value == "%(asctime)s":
                        value = self._timestamp(formatter)
                    else:
                        return False  # another record attribute: Powertools fills it in
                line[key] = value
        if extra:
            if not _NOT_EXTRA.isdisjoint(extra):
                return False
            line.update(extra)
        line["message"] = message
        line["xray_trace_id"] = _trace_id(formatter)
        if None in line.values():
            line = {k: v for k, v in line.items() if v is not None}
        text = formatter.serialize(line)
        stream = handler.stream
        handler.acquire()
        try:
            stream.write(text + handler.terminator)
            flush = self._flush_of(stream)
            if flush is not None:
                flush()
        finally:
            handler.release()
        return True

    _flushes: tuple[object, Callable[[], object] | None] = (None, None)

    def _flush_of(self, stream: object) -> Callable[[], object] | None:
        """What StreamHandler.flush calls: the stream's flush, looked up once per stream (Lambda's stdout wrapper
        finds it through its __getattr__, an AttributeError raised and caught per lookup, two per line)."""
        cached, flush = self._flushes
        if cached is not stream:
            flush = getattr(stream, "flush", None) if stream else None
            self._flushes = (stream, flush)
        return flush

    _second: tuple[int, Callable[..., Any], str, str] = (-1, time.localtime, "", "")

    def _timestamp(self, formatter: LambdaPowertoolsFormatter) -> str:
        """The formatter's formatTime of now. Its default format is strftime of the second, the milliseconds
        spliced in: the second's two sides are formatted once per second (formatTime runs strftime per line)."""
        if (
            formatter.use_rfc3339_iso8601
            or formatter.datefmt
            or formatter.default_time_format != _DEFAULT_TIME_FORMAT
            or formatter.custom_ms_time_directive != "%F"
        ):
            return formatter.formatTime(cast(logging.LogRecord, _Stamp()))
        second, milliseconds = divmod(time.time_ns() // 1_000_000, 1000)
        cached_second, converter, before, after = self._second
        if second != cached_second or converter is not formatter.converter:
            converter = formatter.converter
            moment = converter(second)
            before, after = (time.strftime(side, moment) for side in _DEFAULT_TIME_FORMAT.split("%F"))
            self._second = (second, converter, before, after)
        return f"{before}{milliseconds:03d}{after}"

    def _only_own_handler_writes(self) -> bool:
        """A record reaches the loggers above only to be suppressed (Powertools filters the root's handlers for the
        service's records); a handler that would write it too (pytest's capture, one added later) means the record
        must be made."""
        parent = self._logger.parent if self._logger.propagate else None
        while parent is not None:
            for handler in parent.handlers:
                if not any(isinstance(f, SuppressFilter) and f.logger in self._logger.name for f in handler.filters):
                    return False
            parent = parent.parent if parent.propagate else None
        return True


_Event = TypeVar("_Event")
_Answer = TypeVar("_Answer")
Handler = Callable[[_Event, Any], _Answer]


def invocation(logger: Logger, metrics: Metrics) -> Callable[[Handler[_Event, _Answer]], Handler[_Event, _Answer]]:
    """`@logger.inject_lambda_context(clear_state=True)` and `@metrics.log_metrics` around a handler, as one wrapper.
    Powertools' two decorators, per invocation, build a context model, merge the keys through three dict copies,
    check the environment and the flush options, each in frames of its own. Here the same per-invocation state is
    set directly: the formatter's keys reset to its defaults plus the Lambda context's keys and cold_start (Powertools'
    own cold-start flag), the thread-safe keys cleared, the metrics flushed when the handler returns or raises
    (tests/unit/test_invocation.py holds it to Powertools' lines). A logger that logs the event, samples its debug
    lines or buffers them takes Powertools' decorators."""

    def wrap(handler: Handler[_Event, _Answer]) -> Handler[_Event, _Answer]:
        formatter = logger.registered_formatter
        log_event = resolve_truthy_env_var_choice(env=os.getenv(powertools_constants.LOGGER_LOG_EVENT_ENV, "false"))
        if (
            log_event
            or logger.sampling_rate
            or logger._buffer_config
            or type(formatter) is not LambdaPowertoolsFormatter
        ):
            decorated: Handler[_Event, _Answer] = logger.inject_lambda_context(
                metrics.log_metrics(handler), clear_state=True
            )
            return decorated

        @functools.wraps(handler)
        def invoked(event: _Event, context: Any) -> _Answer:
            lambda_context = context.lambda_context if is_durable_context(context) else context
            # one dict display: the same keys in the same order as updates one after the other, without their calls
            formatter.log_format = {
                **dict.fromkeys(formatter.log_record_order),
                **formatter.keys_combined,
                **logger._default_log_keys,
                # Powertools' flag, shared with its decorators; once it is down only it is read (not the environment)
                "cold_start": powertools_logger.is_cold_start and powertools_logger._is_cold_start(),
                "function_name": lambda_context.function_name,
                "function_memory_size": lambda_context.memory_limit_in_mb,
                "function_arn": lambda_context.invoked_function_arn,
                "function_request_id": lambda_context.aws_request_id,
            }
            formatter.thread_safe_clear_keys()
            try:
                return handler(event, context)
            finally:
                metrics.flush_metrics()

        return invoked

    return wrap


def logger() -> Logger:
    # dev (POWERTOOLS_DEV): Powertools indents its lines; else one encoder, shared
    serializer: dict[str, Any] = {} if powertools_dev_is_set() else {"json_serializer": _log_line_json}
    # Powertools annotates json_deserializer as returning str; a JSON decoder returns any JSON value
    return ServiceLogger(service=SERVICE, json_deserializer=cast(Any, _message_as_json), **serializer)


_VALUES = json.JSONEncoder(separators=(",", ":"))


class CountsFirst(AmazonCloudWatchEMFProvider):
    """Powertools' EMF provider; counts of standard resolution (every request's ApiRequests, a feature's Deducts) are
    added without generic validation, and an invocation with only those under the service dimension is flushed
    from a template per metric names."""

    _templates: dict[tuple[str, ...], tuple[str, tuple[str, ...]]] = {}

    def add_metric(self, name: str, unit: MetricUnit | str, value: float, resolution: Any = 60) -> None:
        if (
            unit is not MetricUnit.Count
            or resolution != 60
            or type(value) is not int
            or not 0 < len(name) <= MAX_METRIC_NAME_LENGTH
            or name != name.strip()
            or len(self.metric_set) >= MAX_METRICS - 1
        ):
            super().add_metric(name, unit, value, resolution)
            return
        metric = self.metric_set.get(name)
        if metric is None:
            metric = self.metric_set[name] = defaultdict(list)
        elif len(metric["Value"]) >= MAX_METRICS - 1:
            super().add_metric(name, unit, value, resolution)
            return
        metric["Unit"] = "Count"
        metric["StorageResolution"] = 60
        metric["Value"].append(float(value))

    _disabled: bool | None = None

    def _metrics_disabled(self) -> bool:
        """is_metrics_disabled() read once: a Lambda container's environment is fixed for its life (Powertools parses
        two variables again per flush)."""
        if self._disabled is None:
            self._disabled = is_metrics_disabled()
        return self._disabled

    def flush_metrics(self, raise_on_empty_metrics: bool = False) -> None:
        if self._metrics_disabled():
            # Powertools' flush writes nothing then, and clears nothing: the counts would pile up across invocations
            # until its 100-value limit printed them anyway, in one line stamped with that later flush's time
            self._clear()
            return
        line = self._counts_line()
        if line is None:
            super().flush_metrics(raise_on_empty_metrics)
            return
        sys.stdout.write(line + "\n")  # print's two writes in one
        self._clear()

    def _clear(self) -> None:
        if self.default_dimensions:
            self.clear_metrics()
        else:  # what clear_metrics does, without its debug line and the empty defaults' re-validation
            self.metric_set.clear()
            self.dimension_set.clear()
            self.dimension_sets.clear()
            self.metadata_set.clear()

    def _counts_line(self) -> str | None:
        """The EMF line Powertools would print, or None: it builds this one itself."""
        metrics, service = self.metric_set, self.service
        if (
            not metrics
            or self.metadata_set
            or self.dimension_sets
            or self.timestamp is not None
            or not self.namespace
            or not service
            or (self.dimension_set and self.dimension_set != {"service": service})
        ):
            return None
        names = tuple(metrics)
        for metric in metrics.values():
            if metric.get("Unit") != "Count" or metric.get("StorageResolution", 60) != 60:
                return None
        template = self._templates.get((self.namespace, service, *names))
        if template is None:
            definitions = [{"Name": name, "Unit": "Count"} for name in names]
            template = self._templates[(self.namespace, service, *names)] = (
                '{"_aws":{"Timestamp":%d,"CloudWatchMetrics":'
                + _VALUES.encode(
                    [{"Namespace": self.namespace, "Dimensions": [["service"]], "Metrics": definitions}]
                ).replace("%", "%%")
                + "},"
                + _VALUES.encode({"service": service})[1:-1].replace("%", "%%"),
                tuple(f"{_VALUES.encode(name)}:[" for name in names),
            )
        head, keys = template
        values = _values_text(keys, metrics)
        if values is None:
            values = _VALUES.encode({name: metric["Value"] for name, metric in metrics.items()})[1:-1]
        return head % (time.time_ns() // 1_000_000) + "," + values + "}"


def _values_text(keys: tuple[str, ...], metrics: Mapping[str, Any]) -> str | None:
    """The metrics' values as the JSON encoder writes them after their keys (`keys`: each name's `"name":[`), when
    every value is a finite float (what a count added here is); else None. A float's JSON is its repr; NaN and the
    infinities are spelt otherwise (their reprs, nan and inf, are the only ones with an n)."""
    parts = []
    for key, metric in zip(keys, metrics.values(), strict=True):
        try:
            joined = ",".join(map(float.__repr__, metric["Value"]))
        except TypeError:  # an int, a bool: the encoder's own spelling
            return None
        if "n" in joined:
            return None
        parts.append(f"{key}{joined}]")
    return ",".join(parts)


def metrics() -> Metrics:
    shared = Metrics(namespace=NAMESPACE, service=SERVICE)  # the process-wide metric, dimension and metadata sets
    return Metrics(
        provider=CountsFirst(
            namespace=NAMESPACE,
            service=SERVICE,
            metric_set=shared.metric_set,
            dimension_set=shared.dimension_set,
            metadata_set=shared.metadata_set,
            default_dimensions=shared.default_dimensions,
        )
    )


def tracer() -> Tracer:
    """X-Ray (the template turns Tracing on); disabled outside Lambda and under `sam local`."""
    return Tracer(service=SERVICE)
