"""The rules that keep the house readable, checked on the code itself: handler -> service -> store / outbox /
dal, never back; SQL and redis-py / PyMySQL only in dal/ and a feature's store.py and tx.py (what runs inside a
transaction); one Lua file per script,
prefixed by its feature, with a header, wrapped by exactly one typed store method."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hotledger.features import FEATURES as REGISTERED

REPO = Path(__file__).resolve().parents[2]
FUNCTIONS = REPO / "functions"
HOTLEDGER = FUNCTIONS / "hotledger"
LUA = REPO / "layers" / "lua"
# every registered feature's package (hotledger.features names their modules), and the outbox
FEATURES = (*(module.split(".")[1] for module in REGISTERED), "outbox")
LUA_PREFIXES = (
    "ledger_",
    "hold_",
    "voucher_",
    "redpacket_",
    "delay_",
    "inbox_",
    "journey_",
    "lock_",
    "outbox_",
    "ids_",
    "idem_",
)
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|REPLACE)\b.*\b(FROM|INTO|SET|VALUES)\b", re.I | re.S)


def _modules() -> list[Path]:
    return sorted(p for p in FUNCTIONS.rglob("*.py") if "__pycache__" not in p.parts)


def _may_touch_storage(path: Path) -> bool:
    rel = path.relative_to(HOTLEDGER) if HOTLEDGER in path.parents else None
    return rel is not None and (rel.parts[0] == "dal" or path.name in ("store.py", "tx.py"))


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _strings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


@pytest.mark.parametrize(
    "path", [p for p in _modules() if not _may_touch_storage(p)], ids=lambda p: str(p.relative_to(REPO))
)
def test_no_sql_and_no_storage_driver_outside_dal_and_stores(path):
    drivers = {name for name in _imports(path) if name.split(".")[0] in ("redis", "pymysql")}
    assert not drivers, f"{path.name} imports {drivers}: only dal/, store.py and tx.py talk to Redis and MySQL"
    sql = [s for s in _strings(path) if SQL.match(s)]
    assert not sql, f"{path.name} holds SQL: {sql[:2]}"


@pytest.mark.parametrize(
    "path", [p for p in _modules() if _may_touch_storage(p)], ids=lambda p: str(p.relative_to(REPO))
)
def test_stores_and_dal_never_import_upwards(path):
    """A store knows its tables and scripts, never its service; dal knows no feature."""
    upward = {
        name
        for name in _imports(path)
        if name.startswith(("api", "hotledger.runtime", "hotledger.features"))
        or name.endswith((".routes", ".feature"))
        or (
            name.startswith("hotledger.")
            and name.split(".")[1] in FEATURES
            and not name.endswith((".store", ".tx", ".rows", ".replies", ".events", ".entry", ".kinds"))
        )
    }
    assert not upward, f"{path.relative_to(REPO)} imports {upward}"


def _is_handler(path: Path) -> bool:
    """functions/<fn>/app.py, functions/api and each feature's routes.py (its API handlers)."""
    return HOTLEDGER not in path.parents or path.name == "routes.py"


def test_handlers_never_reach_a_store():
    """Handlers never reach a store: they ask the services each feature.py (and hotledger.runtime) builds."""
    for path in _modules():
        if not _is_handler(path):
            continue
        stores = {n for n in _imports(path) if n.endswith(".store")}
        assert not stores, f"{path.relative_to(REPO)} reaches into {stores}"


@pytest.mark.parametrize("script", sorted(LUA.glob("*.lua")), ids=lambda p: p.name)
def test_each_lua_script_is_prefixed_has_a_header_and_one_typed_wrapper(script):
    assert script.stem.startswith(LUA_PREFIXES), f"{script.name}: prefix it with its feature"
    lines = script.read_text().split("\n")
    header = lines[: next(i for i, line in enumerate(lines) if not line.startswith("--"))]  # the leading comments
    assert header[0].startswith(f"-- {script.stem}"), f"{script.name}: the header names the script first"
    text = "\n".join(header)
    assert "KEYS[" in text and "Returns" in text.replace("returns", "Returns"), (
        f"{script.name}: header states KEYS and replies"
    )
    run = re.compile(r'\.run\(\s*"' + script.stem + '"')
    callers = [p for p in _modules() if run.search(p.read_text())]
    assert len(callers) == 1 and _may_touch_storage(callers[0]), (
        f"{script.name} is run from {[str(p.relative_to(REPO)) for p in callers]}: one typed wrapper in a store or dal"
    )


def test_the_lua_reply_check_reads_every_stated_status_reply():
    """tests/lua_replies.py holds the scripts' headers to the suite: it must find the replies the headers state."""
    import lua_replies

    stated = lua_replies.stated_replies()
    assert {
        ("ledger_apply", "insufficient"),
        ("ledger_apply", "too_many_pending"),
        ("voucher_take", "held"),
        ("lock_release", "not_owner"),
        ("idem_begin", "retaken"),
    } <= stated
    assert len({script for script, _ in stated}) >= 15


def test_every_feature_package_is_registered_once_and_only_the_api_imports_its_routes():
    """A feature is one package and one registration: each <feature>/feature.py is listed in hotledger.features, and
    its routes module is imported by the API function alone (through the registry), never by a service or the writer."""
    from hotledger.features import registered

    declared = {p.parent.name for p in HOTLEDGER.glob("*/feature.py")}
    listed = [f.name for f in registered() if f.routes or f.persisters is not dict or f.reconcile_parts is not tuple]
    assert declared <= set(listed) and len(listed) == len(set(listed)), (declared, listed)
    for path in _modules():
        routes = {n for n in _imports(path) if n.endswith(".routes")}
        assert not routes, (
            f"{path.relative_to(REPO)} imports {routes}: only api/app.py and api/authorization.py load routes"
        )
