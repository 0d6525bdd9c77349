"""Only events the service signed reach the DB (issue 11, section 2): a record on the topic without the service's
HMAC, with a field changed after signing, or signed with a key the service does not hold (any more) is
dead-lettered with the reason and changes nothing. Through the writer handler, real Redis, DB and broker records;
the keyring from Secrets Manager (moto) for the rotation cases."""

import json
import os
import time

import pytest

from helpers import invoke_writer, ledger_records, moto_secrets, signed_value
from hotledger.dal.event_keys import EventKeys, record_value
from hotledger.outbox.events import LedgerEvent, signed
from hotledger.runtime import id_generator
from infra.event_keys import new_keyring, rotate


def funded(api, redis_client, sql) -> int:
    """An account holding 10.00, in Redis and in the DB."""
    user_id = api.account(balance="10.00")
    assert invoke_writer(ledger_records(redis_client, [user_id])) == {"batchItemFailures": []}
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1000,),)
    return user_id


def forged_recharge(sql, user_id: int, amount: int = 100_000_000) -> dict:
    """A recharge that looks like the service's own: next version, the account's balance plus the amount."""
    ((balance, version),) = sql("SELECT balance, version FROM t_account WHERE user_id = %s", (user_id,))
    return LedgerEvent(
        type="ledger",
        id=id_generator().next_id(),
        kind="R",
        user_id=user_id,
        amount=amount,
        balance_after=balance + amount,
        version=version + 1,
        epoch="forged",
        ts=int(time.time() * 1000),
        open="1",
    ).model_dump()


def nothing_changed(api, sql, user_id: int) -> None:
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1000,),)
    assert sql("SELECT COUNT(*) FROM t_pay WHERE user_id = %s", (user_id,)) == ((1,),)  # the funding recharge alone
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "10.00"


def dead_letter_error(sql, settings, offset: int) -> str:
    ((error,),) = sql(
        "SELECT error FROM t_dead_letter WHERE topic = %s AND offset_no = %s", (settings.kafka_topic, offset)
    )
    return error


def deliver(value: bytes, user_id: int) -> int:
    """The record at a fresh offset (dead letters are unique by topic, partition and offset); returns the offset."""
    offset = id_generator().next_id()
    assert invoke_writer([(0, offset, str(user_id).encode(), value)]) == {"batchItemFailures": []}
    return offset


def test_a_forged_recharge_without_a_mac_is_dead_lettered_and_changes_nothing(api, redis_client, sql, settings):
    user_id = funded(api, redis_client, sql)
    offset = deliver(json.dumps(forged_recharge(sql, user_id)).encode(), user_id)
    nothing_changed(api, sql, user_id)  # before: the balance was 1,000,010.00
    assert "forged: the record carries no signature" in dead_letter_error(sql, settings, offset)


def test_a_signed_event_with_a_field_changed_is_dead_lettered(api, redis_client, sql, settings):
    user_id = funded(api, redis_client, sql)
    genuine = json.loads(signed_value(forged_recharge(sql, user_id, amount=1)))
    offset = deliver(record_value({**genuine, "amount": 100_000_000, "balance_after": 100_001_000}), user_id)
    nothing_changed(api, sql, user_id)
    assert "forged: the MAC does not match" in dead_letter_error(sql, settings, offset)


# the service's own layout (canonical fields, then kid and mac: the writer checks the MAC over the bytes before
# the signature) changed three ways: a covered byte, a field slipped in before the signature, one after it
TAMPERED = {
    "field_changed": lambda value: value.replace(b'"amount":1,', b'"amount":100000000,'),
    "field_before_signature": lambda value: value.replace(b',"kid":', b',"amount":100000000,"kid":'),
    "field_after_signature": lambda value: value[:-1] + b',"amount":100000000}',
}


@pytest.mark.parametrize("tamper", TAMPERED.values(), ids=TAMPERED.keys())
def test_a_signed_record_changed_in_the_service_layout_is_dead_lettered(api, redis_client, sql, settings, tamper):
    user_id = funded(api, redis_client, sql)
    genuine = signed_value(forged_recharge(sql, user_id, amount=1))
    changed = tamper(genuine)
    assert changed != genuine and json.loads(changed)["amount"] == 100_000_000
    offset = deliver(changed, user_id)
    nothing_changed(api, sql, user_id)
    # a field after the signature leaves no signature where the layout has it
    assert dead_letter_error(sql, settings, offset).startswith(
        ("forged: the MAC does not match", "forged: the record carries no signature")
    )


def test_a_signed_record_in_another_layout_is_dead_lettered(api, redis_client, sql, settings):
    """Issue 19 item 14: the service publishes one layout (record_value); the earlier one was never released, so a
    record in any other is not the service's, even with a MAC that would match its fields encoded canonically."""
    user_id = funded(api, redis_client, sql)
    value = json.dumps(json.loads(signed_value(forged_recharge(sql, user_id, amount=250)))).encode()
    assert b'", "' in value  # not the service's layout
    offset = deliver(value, user_id)
    nothing_changed(api, sql, user_id)
    assert "forged: the record carries no signature in the service's layout" in dead_letter_error(sql, settings, offset)


def test_an_event_signed_with_a_key_the_service_does_not_hold_is_dead_lettered(api, redis_client, sql, settings):
    user_id = funded(api, redis_client, sql)
    attacker = EventKeys(None, json.dumps(new_keyring()), 0).keyring()
    offset = deliver(record_value(signed(forged_recharge(sql, user_id), attacker)), user_id)
    nothing_changed(api, sql, user_id)
    assert f"forged: signed with key {attacker.kid!r}" in dead_letter_error(sql, settings, offset)


def test_the_service_own_events_still_persist_next_to_a_forged_one(api, redis_client, sql, settings):
    """One batch: the forged record is set aside, the genuine deduct is applied once."""
    user_id = funded(api, redis_client, sql)
    offset = id_generator().next_id()
    forged = (0, offset, str(user_id).encode(), json.dumps(forged_recharge(sql, user_id)).encode())
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"})[0] == 200
    genuine = ledger_records(redis_client, [user_id], first_offset=offset + 1)
    assert invoke_writer([forged, *genuine]) == {"batchItemFailures": []}
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((900,),)
    assert "forged" in dead_letter_error(sql, settings, offset)


@pytest.fixture
def keyring_secret(monkeypatch):
    """The writer's keyring in a Secrets Manager secret (moto), cached by Powertools for an hour."""
    with moto_secrets(monkeypatch) as client:
        # starts with the run's keyring, which the API signed with
        arn = client.create_secret(Name="hotledger/event-keys", SecretString=os.environ["EVENT_KEYS"])["ARN"]
        keys = EventKeys(arn, None, 3600)
        monkeypatch.setattr("writer.app.event_keys", lambda: keys)
        yield client, arn, keys


def test_after_a_rotation_the_writer_accepts_new_and_previous_keys_and_refuses_the_previous_after_its_grace(
    api, redis_client, sql, settings, keyring_secret
):
    client, arn, writer_keys = keyring_secret
    user_id = funded(api, redis_client, sql)
    before = writer_keys.keyring()  # cached in the writer for an hour
    rotate(arn, grace_s=600, client=client)
    producer_keys = EventKeys(arn, None, 3600)  # a function that reads the secret after the rotation
    new = producer_keys.keyring(fresh=True)
    assert (new.previous_kid, new.kid != before.kid) == (before.kid, True)

    def recharge(keyring, amount: int) -> int:
        event = forged_recharge(sql, user_id, amount)  # here: a genuine event, signed with a key of the keyring
        return deliver(record_value(signed(event, keyring)), user_id)

    recharge(new, 100)  # a key id the writer's cached keyring does not know: it reads the secret again once
    recharge(before, 200)  # the previous key, within its grace period
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1300,),)
    client.put_secret_value(
        SecretId=arn,
        SecretString=json.dumps(
            {
                **json.loads(client.get_secret_value(SecretId=arn)["SecretString"]),
                "previous_until": int(time.time()) - 1,
            }
        ),
    )
    writer_keys.keyring(fresh=True)
    offset = recharge(before, 400)
    assert sql("SELECT balance FROM t_account WHERE user_id = %s", (user_id,)) == ((1300,),)
    assert "past its grace period" in dead_letter_error(sql, settings, offset)
