"""Resource limits (issue 10 item 20) decided without Redis: the refusals, their codes, what is and is not a key's
answer, and the settings. The scripts' side runs on a real Redis in tests/integration/test_limits.py."""

import pytest

from hotledger import errors, keys
from hotledger.config import build_settings
from hotledger.dal.delay_queue import DelayQueue, QueueFull
from hotledger.ledger.replies import ApplyReply, ApplyStatus
from hotledger.ledger.service import BUSINESS_REFUSALS, refusal


def test_too_many_pending_is_a_retryable_429_not_the_keys_answer():
    error = refusal(ApplyReply.parse([b"too_many_pending"]))
    assert isinstance(error, errors.TooManyPending) and (error.status, error.code) == (429, "TOO_MANY_PENDING")
    assert ApplyStatus.TOO_MANY_PENDING not in BUSINESS_REFUSALS  # a retry with the same key may charge later


def test_too_many_keys_is_a_retryable_429_not_the_keys_answer():
    error = refusal(ApplyReply.parse([b"too_many_keys"]))
    assert isinstance(error, errors.TooManyKeys) and (error.status, error.code) == (429, "TOO_MANY_KEYS")
    assert ApplyStatus.TOO_MANY_KEYS not in BUSINESS_REFUSALS  # the same key charges in the next window


def test_the_limits_are_settings():
    assert (build_settings({}).delay_max_queue_size, build_settings({}).max_pending_entries) == (100_000, 10_000)
    cfg = build_settings({"DELAY_MAX_QUEUE_SIZE": "7", "MAX_PENDING_ENTRIES": "9"})
    assert (cfg.delay_max_queue_size, cfg.max_pending_entries) == (7, 9)


class FakeLua:
    def __init__(self, reply):
        self.client, self.reply, self.calls = None, reply, []

    def run(self, name, keys_, args):
        self.calls.append((name, keys_, args))
        return self.reply


def test_only_bounded_offers_carry_the_bound_and_a_full_answer_raises():
    lua = FakeLua([1, b"1000"])
    queue = DelayQueue(lua, max_size=5)
    assert queue.offer("q", "e", due_at_ms=1000) is True and lua.calls[-1][2][-1] == 0  # the service's own offers
    assert queue.offer("q", "e", due_at_ms=1000, bounded=True) is True and lua.calls[-1][2][-1] == 5
    assert lua.calls[-1][1] == keys.delay_offer_keys("q")
    lua.reply = [b"full", 5]
    with pytest.raises(QueueFull):
        queue.offer("q", "e2", due_at_ms=1000, bounded=True)
    assert (errors.QueueFull.status, errors.QueueFull.code) == (429, "QUEUE_FULL")


def test_every_setting_is_read_from_its_variable_documented_and_every_ssm_tunable_is_a_setting():
    """The settings class guard (issue 19): each field of Settings is read from the environment under its name, the
    configuration doc names it (docs/configuration.md), and the SSM tunables are all fields (a typo there is never read)."""
    import re
    from pathlib import Path

    from hotledger import config

    configuration = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    documented = {
        name
        for row in re.findall(r"^\| (`[A-Z].*?) \|", configuration, re.M)
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row)
    }
    fields = set(config.Settings.model_fields)
    assert {config.ENV[f] for f in fields} - documented == set()
    assert fields >= config.SSM_TUNABLES
