"""The DB and Redis connection settings for TLS and authentication: DB_TLS=verify needs a CA bundle and checks the
chain and the host name; REDIS_USERNAME reaches redis-py (ElastiCache RBAC)."""

import certifi
import pytest

from hotledger.config import build_settings
from hotledger.dal import db, redis_store


def test_verify_checks_the_chain_and_the_host_name_against_the_bundle(tmp_path):
    bundle = tmp_path / "rds-global-bundle.pem"
    assert db.tls_args(build_settings({"DB_TLS": "verify", "DB_CA_BUNDLE": str(bundle)})) == {
        "ssl_ca": str(bundle),
        "ssl_verify_cert": True,
        "ssl_verify_identity": True,
    }


def test_certifi_names_the_bundle_of_the_certifi_package():
    assert db.tls_args(build_settings({"DB_TLS": "verify", "DB_CA_BUNDLE": "certifi"}))["ssl_ca"] == certifi.where()


def test_verify_without_a_bundle_is_refused_and_off_is_plain():
    with pytest.raises(ValueError, match="DB_CA_BUNDLE"):
        build_settings({"DB_TLS": "verify"})
    with pytest.raises(ValueError, match="DB_TLS"):
        build_settings({"DB_TLS": "prefer"})
    assert db.tls_args(build_settings({})) == {}


def test_redis_username_and_password_reach_redis_py():
    client = redis_store.connect(
        build_settings(
            {"REDIS_URL": "rediss://cache.example:6379/0", "REDIS_USERNAME": "hotledger", "REDIS_PASSWORD": "token"}
        )
    )
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("hotledger", "token")
    assert client.connection_pool.connection_class.__name__ == "SSLConnection"
