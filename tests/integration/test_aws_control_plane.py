"""AWS control-plane calls (Secrets Manager, SSM) through localstack-client, against a real LocalStack
when one answers on LOCALSTACK_HOST (default localhost:4566), otherwise against moto's server."""

from __future__ import annotations

import json
import os
import socket
import urllib.request

import pymysql
import pytest
from localstack_client.session import Session

from hotledger.config import build_settings


def _localstack_running(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/_localstack/health", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def aws_endpoint():
    host = os.environ.get("LOCALSTACK_HOST", "localhost:4566")
    if _localstack_running(host):
        yield host
        return
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop()


def test_db_credentials_from_secrets_manager_and_tunables_from_ssm(aws_endpoint, settings, monkeypatch):
    session = Session(localstack_host=aws_endpoint)
    secrets, ssm = session.client("secretsmanager"), session.client("ssm")
    arn = secrets.create_secret(
        Name=f"hotledger/db-{os.getpid()}",
        SecretString=json.dumps(
            {
                "username": settings.db_user,
                "password": settings.db_password,
                "host": settings.db_host,
                "port": settings.db_port,
                "dbname": settings.db_name,
            }
        ),
    )["ARN"]
    redis_arn = secrets.create_secret(Name=f"hotledger/redis-{os.getpid()}", SecretString="s3cret-token")["ARN"]
    path = f"/hotledger-{os.getpid()}"
    ssm.put_parameter(Name=f"{path}/reconcile_age_s", Value="42", Type="String")
    ssm.put_parameter(Name=f"{path}/publish_timeout_s", Value="1.5", Type="String")
    ssm.put_parameter(Name=f"{path}/not_a_tunable", Value="x", Type="String")

    for name, value in {
        "AWS_ENDPOINT_URL": f"http://{aws_endpoint}",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }.items():
        monkeypatch.setenv(name, value)
    # only the pointers: credentials, host and tunables must come from the control plane
    loaded = build_settings({"DB_SECRET_ARN": arn, "REDIS_AUTH_SECRET_ARN": redis_arn, "SSM_PARAMETER_PATH": path})
    assert (loaded.db_user, loaded.db_host, loaded.db_port, loaded.db_name) == (
        settings.db_user,
        settings.db_host,
        settings.db_port,
        settings.db_name,
    )
    assert loaded.redis_password == "s3cret-token"
    assert loaded.reconcile_age_s == 42 and loaded.publish_timeout_s == 1.5
    conn = pymysql.connect(
        host=loaded.db_host,
        port=loaded.db_port,
        user=loaded.db_user,
        password=loaded.db_password,
        database=loaded.db_name,
    )
    with conn.cursor() as cur:
        cur.execute("SELECT DATABASE()")  # the credentials from the secret reach the service's schema
        assert cur.fetchone()[0] == settings.db_name
    conn.close()
