"""The modules of functions/hotledger import one another without a circle, and the ledger books without knowing who
listens: every import counts (at the top, inside a function, under TYPE_CHECKING), as a reader follows them."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FUNCTIONS = REPO / "functions"
HOTLEDGER = FUNCTIONS / "hotledger"


def _module_name(path: Path) -> str:
    parts = path.relative_to(FUNCTIONS).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """hotledger module -> the hotledger modules it imports (`from package import module` names the module)."""
    modules = {_module_name(p): p for p in HOTLEDGER.rglob("*.py") if "__pycache__" not in p.parts}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        graph[name] = {m for m in found if m in modules and m != name and modules[m].name != "__init__.py"}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_check_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_among_the_hotledger_modules():
    assert circles(import_graph()) == []


def test_the_ledger_imports_neither_monitors_nor_webhooks():
    """Monitors and webhooks hear of a booking through the registry (Feature.on_booked)."""
    graph = import_graph()
    ledger = {
        m: sorted(i for i in imported if i.split(".")[1] in ("monitors", "webhooks"))
        for m, imported in graph.items()
        if m.startswith("hotledger.ledger.")
    }
    assert {m: i for m, i in ledger.items() if i} == {}
