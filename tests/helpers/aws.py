"""AWS control planes in moto (Secrets Manager and friends), never a stand-in for Redis, Kafka or the DB."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def moto_secrets(monkeypatch):
    """Secrets Manager in moto (in process), with Powertools' parameter cache empty before and after: yields a client."""
    import boto3
    from aws_lambda_powertools.utilities import parameters
    from moto import mock_aws

    for name, value in (
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        parameters.clear_caches()
        try:
            yield boto3.client("secretsmanager")
        finally:
            parameters.clear_caches()
