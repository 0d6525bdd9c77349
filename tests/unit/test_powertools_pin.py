"""The hot lane (api/hot_lane.py) and the log and EMF line writers (hotledger/observability.py) lean on private
members of Powertools where it has no public extension point, each kept because it pays a share of a deduct's
billed duration (docs/performance.md, The lean hot path). Private members change without notice: this fails on any
Powertools version the lock files do not name, so an upgrade is a deliberate change that re-checks every one below
(tests/unit/test_log_lines.py, test_metric_lines.py, test_invocation.py and tests/integration/test_hot_lane.py hold
the lines and answers to Powertools' own)."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCKS = [REPO / "functions" / "requirements.lock", REPO / "requirements-dev.lock"]

# (object, private member) the code uses, by where
PRIVATE_MEMBERS = {
    "api/hot_lane.py": [
        ("ApiGatewayResolver", "_static_routes"),
        ("ApiGatewayResolver", "_dynamic_routes"),
        ("ApiGatewayResolver", "_to_proxy_event"),
        ("ApiGatewayResolver", "_remove_prefix"),
        ("ApiGatewayResolver", "_build_response"),
        ("ApiGatewayResolver", "_call_exception_handler"),
        ("ApiGatewayResolver", "_response_builder_class"),
        ("ApiGatewayResolver", "_to_response"),
        ("ApiGatewayResolver", "_serializer"),
        ("ApiGatewayResolver", "_convert_matches_into_route_keys"),
    ],
    "hotledger/observability.py": [
        ("Logger", "_logger"),
        ("Logger", "_buffer_config"),
        ("Logger", "_default_log_keys"),
        ("logging.logger module", "_is_cold_start"),
    ],
}


def _locked(lock: Path) -> str:
    found = re.search(r"^aws-lambda-powertools==([^\s\\]+)", lock.read_text(), re.MULTILINE)
    assert found, f"{lock} names no aws-lambda-powertools"
    return found.group(1)


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_the_installed_powertools_is_the_one_the_lock_names(lock):
    assert version("aws-lambda-powertools") == _locked(lock)


def test_every_private_member_the_fast_paths_use_exists_in_this_version():
    from aws_lambda_powertools import Logger
    from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, APIGatewayRestResolver
    from aws_lambda_powertools.logging import logger as logger_module

    logger = Logger(service="pin-check")
    instances = {
        "ApiGatewayResolver": [APIGatewayRestResolver(), APIGatewayHttpResolver()],
        "Logger": [logger],
        "logging.logger module": [logger_module],
    }
    missing = [
        (where, owner, member)
        for where, members in PRIVATE_MEMBERS.items()
        for owner, member in members
        for instance in instances[owner]
        if not hasattr(instance, member)
    ]
    assert missing == []


def test_the_list_names_every_private_powertools_member_the_fast_paths_use():
    used = {
        where: set(re.findall(r"\b(?:app|self\.app|logger|formatter|powertools_logger)\._([a-z]\w*)", text))
        for where in PRIVATE_MEMBERS
        for text in [(REPO / "functions" / where).read_text()]
    }
    used["hotledger/observability.py"] |= {"logger"}  # self._logger: the Logger's own standard logger
    listed = {where: {member.lstrip("_") for _, member in members} for where, members in PRIVATE_MEMBERS.items()}
    assert used == listed
