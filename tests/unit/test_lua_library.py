"""layers/lua/lib: pieces several scripts share, written once and included where a script says so."""

import re
from pathlib import Path

import pytest


def test_a_scripts_include_line_is_the_library_piece(tmp_path):
    """layers/lua/lib holds pieces several scripts share, written once (issue 31: the rebuild hold's check)."""
    from hotledger.dal.redis_store import script_text

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "piece.lua").write_text("local function piece() return 1 end\n")
    (tmp_path / "s.lua").write_text("-- s\n--! include piece\nreturn piece()\n")
    assert script_text(tmp_path / "s.lua") == "-- s\nlocal function piece() return 1 end\n\nreturn piece()\n"


def test_a_piece_may_include_another_and_each_is_expanded_once(tmp_path):
    from hotledger.dal.redis_store import script_text

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "base.lua").write_text("local B = 1\n")
    (tmp_path / "lib" / "top.lua").write_text("--! include base\nlocal T = B\n")
    (tmp_path / "s.lua").write_text("--! include top\n--! include base\nreturn T\n")
    assert script_text(tmp_path / "s.lua") == "local B = 1\n\nlocal T = B\n\n\nreturn T\n"


def test_a_script_leaves_out_the_pieces_functions_it_never_calls(tmp_path):
    """A script's top level runs at every EVALSHA, so each function it defines is a closure made and collected per
    call (issue 33 goal 2): a piece's functions that the script never calls, also through another left-out function,
    are not in its text; comments do not count as calls."""
    from hotledger.dal.redis_store import script_text

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "piece.lua").write_text(
        "-- piece: used_one_liner, used, helper_of_unused, unused\n"
        "local function used_one_liner(x) return x end\n"
        "local function helper_of_unused(x)\n  return x\nend\n"
        "-- unused(x) calls helper_of_unused\n"
        "local function unused(x)\n  if x then return helper_of_unused(x) end\n  return 0\nend\n"
        "local function used(x)\n  return used_one_liner(x)\nend\n"
    )
    (tmp_path / "s.lua").write_text("--! include piece\nreturn used(1)  -- not unused(1)\n")
    text = script_text(tmp_path / "s.lua")
    assert "local function used(x)\n  return used_one_liner(x)\nend\n" in text
    assert "local function used_one_liner(x) return x end\n" in text
    assert "local function unused" not in text and "local function helper_of_unused" not in text
    assert "  return 0\nend" not in text  # no orphan lines of a left-out function


def test_a_function_called_after_a_string_holding_two_dashes_is_kept(tmp_path):
    """`--` inside a quoted string starts no comment: the call after it on the line still counts, or the script would
    be sent without a function it calls (a nil global at run time, after the writes made before it)."""
    from hotledger.dal.redis_store import script_text

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "piece.lua").write_text("local function used(x)\n  return x\nend\n")
    (tmp_path / "s.lua").write_text("--! include piece\nreturn 'a -- b' .. \"c --\" .. used('d')  -- a comment\n")
    assert "local function used(x)" in script_text(tmp_path / "s.lua")


LUA = Path(__file__).resolve().parents[2] / "layers/lua"
SCRIPTS = sorted(LUA.glob("*.lua"))


@pytest.mark.parametrize("piece", sorted((LUA / "lib").glob("*.lua")), ids=lambda p: p.stem)
def test_each_pieces_function_is_laid_out_so_that_it_can_be_left_out_whole(piece):
    """Leaving a function out finds its end by the layout: `local function name(` at a line's start, ending on its own
    line or at the next `end` alone on a line."""
    from hotledger.dal.redis_store import _FUNCTION

    text = piece.read_text()
    starts = re.findall(r"^local function (\w+)\(", text, re.M)
    blocks = _FUNCTION.findall(text)
    assert blocks == starts
    for match in _FUNCTION.finditer(text):
        body = match.group(0).splitlines()[1:-1]
        assert all(line.startswith((" ", "--")) or not line for line in body), match.group(1)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_no_script_builds_event_json_or_an_entry_string_by_hand(script):
    """Event JSON is lib/event's, the entry string and the hold record are lib/entry's and lib/holds' (issue 31): a
    script splicing '{"' or joining/splitting fields on ';' itself would drift from outbox/events.py and ledger/entry.py."""
    text = script.read_text()
    assert "'{\"" not in text and '"type":' not in text, "build the event with lib/event"
    assert not re.search(r"table\.concat\([^)]*';'\)", text), "write the entry with entry_string / hold_string"
    assert "'([^;]*);'" not in text, "read the entry with entry_fields / hold_fields"


def test_the_lua_entry_kinds_are_the_rulebooks():
    """lib/entry's ENTRY_TAILS names the fields of every kind of ledger/kinds.py, and no other."""
    from hotledger.ledger.kinds import KINDS

    text = (LUA / "lib/entry.lua").read_text()
    table = text[text.index("local ENTRY_TAILS = {") : text.index("\n}\n", text.index("local ENTRY_TAILS = {"))]
    assert set(re.findall(r"\b([A-Z]) = ", table)) == set(KINDS)


def test_the_entry_string_writes_the_head_in_entry_heads_order():
    """entry_string writes the ledger's eight fields in one concatenation (the hot path's cost, issue 33 goal 2), not
    a loop over ENTRY_HEAD, which entry_fields reads them by: the two name the same fields in the same order."""
    text = (LUA / "lib/entry.lua").read_text()
    head = re.search(r"local ENTRY_HEAD = \{([^}]*)\}", text).group(1)
    start = text.index("local function entry_string(e)")
    function = text[start : text.index("\nend\n", start)]
    assert re.findall(r"\(e\.(\w+) or ''\)", function) == re.findall(r"'(\w+)'", head)


def test_the_docs_table_of_lua_pieces_is_true():
    """docs/adding-a-feature.md ("A new kind of entry") names each piece of lib/, the functions it gives and the
    scripts that include it: each exists, and each script named includes the piece (itself or through another)."""
    from hotledger.dal.redis_store import script_text

    doc = (LUA.parents[1] / "docs/adding-a-feature.md").read_text()
    section = doc[doc.index("### A new kind of entry") : doc.index("The rules every kind keeps")]
    rows = re.findall(r"^\| `lib/(\w+)\.lua` \| (.+) \| (.+) \|$", section, re.M)
    assert {name for name, _, _ in rows} == {p.stem for p in (LUA / "lib").glob("*.lua")}
    for name, what, used_by in rows:
        piece = (LUA / "lib" / f"{name}.lua").read_text()
        for function in re.findall(r"`(\w+)`", what):
            assert re.search(rf"\blocal (function )?{function}\b", piece), (name, function)
        for script in re.findall(
            r"`(\w+)`", used_by
        ):  # its header line: the functions a script never calls are left out
            assert piece.splitlines()[0] in script_text(LUA / f"{script}.lua"), (name, script)
