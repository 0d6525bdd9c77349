"""The service's log lines (hotledger.observability.logger: one shared encoder, no JSON decode attempt for a message
that cannot be JSON) are Powertools' default lines, field for field."""

import io
import logging
import re

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
