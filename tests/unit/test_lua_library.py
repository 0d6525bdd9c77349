"""layers/lua/lib: pieces several scripts share, written once and included where a script says so."""


def test_a_scripts_include_line_is_the_library_piece(tmp_path):
    """layers/lua/lib holds pieces several scripts share, written once (issue 31: the rebuild hold's check)."""
    from hotledger.dal.redis_store import script_text

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "piece.lua").write_text("local function piece() return 1 end\n")
    (tmp_path / "s.lua").write_text("-- s\n--! include piece\nreturn piece()\n")
    assert script_text(tmp_path / "s.lua") == "-- s\nlocal function piece() return 1 end\n\nreturn piece()\n"
