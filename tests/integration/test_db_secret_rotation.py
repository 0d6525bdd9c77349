"""A warm function keeps working across a DB password rotation (issue 11, section 3): the DB refuses the cached
credentials (1045), the writer's connection reads the secret again once and connects with the new password. A real
MariaDB user whose password is changed, the secret in Secrets Manager (moto) cached by Powertools."""

import json
import os
import uuid

import pytest

from helpers import invoke_writer, ledger_records, moto_secrets
from hotledger.config import build_settings
from hotledger.dal import db


@pytest.fixture
def rotating_user(sql, settings, monkeypatch):
    """A DB user of the run's schema whose credentials the functions read from a secret (moto), one hour cache."""
    user = f"rot_{uuid.uuid4().hex[:8]}"
    sql(f"CREATE USER '{user}'@'%%' IDENTIFIED BY 'first-password'")
    sql(f"GRANT ALL ON `{settings.db_name}`.* TO '{user}'@'%%'")
    with moto_secrets(monkeypatch) as client:
        arn = client.create_secret(
            Name=f"hotledger/db-{user}", SecretString=json.dumps({"username": user, "password": "first-password"})
        )["ARN"]
        env = {k: v for k, v in os.environ.items() if k not in ("DB_USER", "DB_PASSWORD")}
        cfg = build_settings({**env, "DB_SECRET_ARN": arn, "SECRETS_MAX_AGE_S": "3600"})
        assert (cfg.db_user, cfg.db_password) == (user, "first-password")
        monkeypatch.setattr(db, "settings", lambda: cfg)
        db._drop_connection()
        yield user, client, arn
        db._drop_connection()
    sql(f"DROP USER '{user}'@'%%'")


def test_a_rotated_db_password_is_read_again_once_the_db_refuses_the_cached_one(api, redis_client, sql, rotating_user):
    user, client, arn = rotating_user
    assert db.query("SELECT CURRENT_USER()")[0][0].startswith(user + "@")
    # the rotation: a new password in the DB and in the secret; the function's cache still holds the first one
    sql(f"ALTER USER '{user}'@'%%' IDENTIFIED BY 'second-password'")
    client.put_secret_value(SecretId=arn, SecretString=json.dumps({"username": user, "password": "second-password"}))
    db._drop_connection()  # the warm connection went away (idle timeout, proxy): the next one logs in again
    user_id = api.account(balance="10.00")
    assert invoke_writer(ledger_records(redis_client, [user_id])) == {"batchItemFailures": []}  # before: DB unavailable
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1000,),)
    assert db.query("SELECT CURRENT_USER()")[0][0].startswith(user + "@")


def test_wrong_credentials_that_the_secret_does_not_fix_stay_an_outage(rotating_user, sql):
    user, client, arn = rotating_user
    sql(f"ALTER USER '{user}'@'%%' IDENTIFIED BY 'third-password'")  # the secret was not updated
    db._drop_connection()
    with pytest.raises(db.DatabaseUnavailable, match="1045"):
        db.query("SELECT 1")
