"""tests/lua_replies.py holds every script of layers/lua to its header: each states its replies as `{'status', ...}`,
or is listed with the integer values its header names (INTEGER_REPLIES), or with why it states none (NO_DECISION);
a new script must be classified, so a reply cannot go unchecked because of the form its header states it in. The
recorder reads each shape of reply, and the check names a stated reply no test produced."""

from __future__ import annotations

import re

import lua_replies
import pytest

SCRIPTS = sorted(p.stem for p in lua_replies.LUA.glob("*.lua"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_states_its_replies_in_a_form_the_check_reads(script):
    path = lua_replies.LUA / f"{script}.lua"
    kinds = [
        bool(lua_replies.status_replies(path)),
        script in lua_replies.INTEGER_REPLIES,
        script in lua_replies.NO_DECISION,
    ]
    assert kinds[0] or kinds[1] or kinds[2], (
        f"{script}: its header states no {{'status'}} reply: list it in tests/lua_replies.py INTEGER_REPLIES "
        "(with the values it returns) or NO_DECISION (with why)"
    )
    assert not (kinds[1] and kinds[2]), script


@pytest.mark.parametrize("script", sorted(lua_replies.INTEGER_REPLIES))
def test_each_integer_script_header_names_the_values_listed(script):
    path = lua_replies.LUA / f"{script}.lua"
    assert path.is_file(), script
    shape, values = lua_replies.INTEGER_REPLIES[script]
    returns = lua_replies.header(path).split("Returns", 1)[1]
    assert shape in ("one", "each", "first")
    for value in values - {"n", "id"}:
        assert re.search(rf"\b{value}\b", returns), f"{script}: its header's Returns does not name {value}"


def test_the_scripts_stating_no_decision_exist():
    assert set(lua_replies.NO_DECISION) <= set(SCRIPTS)


@pytest.mark.parametrize(
    ("script", "reply", "noted"),
    [
        ("ledger_apply", [b"insufficient", b"1.00", b"0.00"], {"insufficient"}),
        ("hold_adopt", b"known", {"known"}),
        ("lock_renew", 0, {"0"}),
        ("lock_renew", 1, {"1"}),
        ("delay_extend", [1, 0, 1], {"1", "0"}),
        ("delay_retry", [2], {"2"}),
        ("delay_offer", [0, 1700000000000], {"0"}),
        ("delay_offer", [b"full", 10], {"full"}),
        ("ledger_set_open", 17, {"n"}),
        ("ledger_set_open", 0, {"0"}),
        ("outbox_stream_revive", None, {"false"}),
        ("outbox_stream_revive", b"1700000000000-0", {"id"}),
        ("inbox_pull", [b"1", b"2"], {"1"}),  # data: never stated, so never missing
    ],
)
def test_the_recorder_reads_each_shape_of_reply(script, reply, noted):
    assert lua_replies.replies_of(script, reply) == noted


def test_a_stated_reply_no_test_produced_is_named():
    stated = lua_replies.stated_replies()
    assert {("lock_renew", "0"), ("delay_extend", "0"), ("delay_retry", "0"), ("journey_done", "0")} <= stated
    saved = set(lua_replies.SEEN)  # what the scripts this run answered so far (integration tests may run first)
    try:
        lua_replies.SEEN.clear()
        assert lua_replies.missing({"lock_renew"}) == {("lock_renew", "0"), ("lock_renew", "1")}
        lua_replies.SEEN.add(("lock_renew", "1"))
        assert lua_replies.missing({"lock_renew"}) == {("lock_renew", "0")}  # the non-owner's renewal: unproduced
        lua_replies.SEEN.add(("lock_renew", "0"))
        assert lua_replies.missing({"lock_renew"}) == set()
    finally:
        lua_replies.SEEN.clear()
        lua_replies.SEEN.update(saved)
