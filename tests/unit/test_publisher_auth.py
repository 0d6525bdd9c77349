"""What each Kafka client is configured with: MSK IAM (SASL_SSL + OAUTHBEARER, a token signed for the function's
region by aws-msk-iam-sasl-signer-python) with KAFKA_AUTH=iam, the plain protocol with KAFKA_AUTH=none."""

from __future__ import annotations

import base64
import time
from urllib.parse import parse_qs, urlparse

import pytest

from hotledger.config import build_settings
from hotledger.dal import publisher


@pytest.fixture
def aws_credentials(monkeypatch):
    """Credentials the signer reads from the default chain, as Lambda provides them (nothing is sent anywhere)."""
    for name in ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token")


def signed_url(token: str) -> tuple[str, dict]:
    """The MSK IAM token is a base64url SigV4-presigned URL: its host and query."""
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    parsed = urlparse(url)
    return parsed.netloc, parse_qs(parsed.query)


def iam_settings(region: str = "eu-central-1"):
    return build_settings({"KAFKA_AUTH": "iam", "AWS_REGION": region, "KAFKA_BOOTSTRAP": "b-1.msk:9098,b-2.msk:9098"})


def test_confluent_with_iam_uses_sasl_ssl_oauthbearer_and_a_token_for_the_region(aws_credentials):
    config = publisher.confluent_config(iam_settings("eu-central-1"))
    assert (config["security.protocol"], config["sasl.mechanism"]) == ("sasl_ssl", "OAUTHBEARER")
    assert config["bootstrap.servers"] == "b-1.msk:9098,b-2.msk:9098"
    assert config["ssl.ca.location"] == "probe"
    token, expiry_s = config["oauth_cb"]("")
    host, query = signed_url(token)
    assert host == "kafka.eu-central-1.amazonaws.com"
    assert query["Action"] == ["kafka-cluster:Connect"]
    assert query["X-Amz-Credential"][0].split("/")[2:4] == ["eu-central-1", "kafka-cluster"]
    assert query["X-Amz-Security-Token"] == ["session-token"]
    assert time.time() < expiry_s < time.time() + 3600  # seconds, as librdkafka expects (not milliseconds)


def test_kafka_python_with_iam_uses_sasl_ssl_oauthbearer_and_a_token_provider_for_the_region(aws_credentials):
    from kafka.net.sasl.oauth import AbstractTokenProvider

    config = publisher.kafka_python_config(iam_settings("ap-southeast-2"))
    assert (config["security_protocol"], config["sasl_mechanism"]) == ("SASL_SSL", "OAUTHBEARER")
    assert config["bootstrap_servers"] == ["b-1.msk:9098", "b-2.msk:9098"]
    provider = config["sasl_oauth_token_provider"]
    assert isinstance(provider, AbstractTokenProvider)  # kafka-python refuses anything else
    host, query = signed_url(provider.token())
    assert host == "kafka.ap-southeast-2.amazonaws.com"
    assert query["X-Amz-Credential"][0].split("/")[2] == "ap-southeast-2"


def test_the_token_provider_asks_the_signer_for_the_configured_region(monkeypatch):
    asked = []
    monkeypatch.setattr(
        publisher, "msk_iam_token", lambda region: (asked.append(region), ("tok", 1_700_000_900_000))[1]
    )
    confluent = publisher.confluent_config(iam_settings("us-west-2"))
    kafka_python = publisher.kafka_python_config(iam_settings("sa-east-1"))
    assert confluent["oauth_cb"]("ignored") == ("tok", 1_700_000_900.0)
    assert kafka_python["sasl_oauth_token_provider"].token() == "tok"
    assert asked == ["us-west-2", "sa-east-1"]


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
def test_without_auth_both_clients_get_the_protocol_as_configured_and_no_sasl(protocol):
    cfg = build_settings({"KAFKA_AUTH": "none", "KAFKA_SECURITY_PROTOCOL": protocol})
    confluent, kafka_python = publisher.confluent_config(cfg), publisher.kafka_python_config(cfg)
    assert confluent["security.protocol"] == protocol.lower()
    assert kafka_python["security_protocol"] == protocol
    assert not {k for k in confluent if k.startswith(("sasl", "oauth"))}
    assert not {k for k in kafka_python if k.startswith("sasl")}


def test_local_default_is_no_auth_and_iam_needs_a_region():
    assert build_settings({}).kafka_auth == "none"
    with pytest.raises(ValueError, match="AWS_REGION"):
        build_settings({"KAFKA_AUTH": "iam"})
    with pytest.raises(ValueError, match="KAFKA_AUTH"):
        build_settings({"KAFKA_AUTH": "scram"})


def test_librdkafka_accepts_the_iam_configuration(aws_credentials):
    """The real confluent-kafka constructor takes it, oauth_cb and all (nothing connects until the first send)."""
    from confluent_kafka import Producer

    Producer(publisher.confluent_config(iam_settings())).purge()
