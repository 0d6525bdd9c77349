"""Powertools Logger, Metrics and Tracer with the service's defaults (env vars still override them)."""

import json
import os
from typing import Any, cast

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.shared.functions import powertools_dev_is_set

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "hotledger")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Hotledger")


# one encoder for every log line (Powertools' default serializer, json.dumps with these options, makes one per line)
_LOG_LINE = json.JSONEncoder(default=str, separators=(",", ":"), ensure_ascii=False)
_JSON_STARTS = frozenset('{["-0123456789tfnNI \t\n\r')


def _message_as_json(message: str):
    """Powertools decodes a message that is JSON text into the line's object; a message that cannot be JSON (most:
    "deducted") is refused here without raising out of the JSON decoder."""
    if not message or message[0] not in _JSON_STARTS:
        raise ValueError("not JSON")
    return json.loads(message)


def logger() -> Logger:
    # dev (POWERTOOLS_DEV): Powertools indents its lines; else one encoder, shared
    serializer: dict[str, Any] = {} if powertools_dev_is_set() else {"json_serializer": _LOG_LINE.encode}
    # Powertools annotates json_deserializer as returning str; a JSON decoder returns any JSON value
    return Logger(service=SERVICE, json_deserializer=cast(Any, _message_as_json), **serializer)


def metrics() -> Metrics:
    return Metrics(namespace=NAMESPACE, service=SERVICE)


def tracer() -> Tracer:
    """X-Ray (the template turns Tracing on); disabled outside Lambda and under `sam local`."""
    return Tracer(service=SERVICE)
