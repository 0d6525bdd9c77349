"""docs/adding-a-feature.md stays true: its table of registered features is the registry, in its order, and each
line of its registration example stands, in that order, in the file the example names."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "adding-a-feature.md"


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_the_table_lists_every_registered_feature_in_the_registry_order():
    from hotledger.features import registered

    rows = re.findall(r"^\| (\w+) \| `([\w/.]+)` \|", _section("The registered features"), re.M)
    assert [name for name, _ in rows] == [feature.name for feature in registered()]
    for name, package in rows:
        if package.endswith("/"):  # a package: its feature.py registers the feature of that name
            module = importlib.import_module(f"hotledger.{package.rstrip('/')}.feature")
            assert module.FEATURE.name == name, (package, module.FEATURE.name)


def example_files() -> dict[str, list[str]]:
    """The registration example's lines, by the file each '# functions/...' line names."""
    block = re.search(r"```python\n(.*?)```", _section("The registration"), re.S)
    assert block, "the registration example is gone"
    files: dict[str, list[str]] = {}
    for line in block.group(1).splitlines():
        if line.startswith("# functions/"):
            current = files.setdefault(line[2:], [])
        elif line.strip():
            current.append(line)
    return files


def stands_in_order(lines: list[str], text: str) -> bool:
    remaining = iter(text.splitlines())
    return all(any(line == candidate for candidate in remaining) for line in lines)


def test_the_check_sees_a_line_out_of_place():
    assert stands_in_order(["a", "c"], "a\nb\nc") and not stands_in_order(["c", "a"], "a\nb\nc")


def test_the_registration_example_stands_in_the_files_it_names():
    files = example_files()
    assert set(files) == {"functions/hotledger/holds/feature.py", "functions/hotledger/features.py"}
    for path, lines in files.items():
        assert stands_in_order(lines, (REPO / path).read_text()), f"{path} no longer reads as the doc shows"


def test_the_adjustment_touched_the_code_files_the_doc_lists_and_no_other():
    """A new kind of entry is its row, its Lua library row and its route file (issue 31): the files that name an
    operator's adjustment are those the doc lists; a branch for it anywhere else makes this fail until the doc says
    so (or the branch reads the kinds table instead)."""
    from hotledger.ledger.kinds import KINDS

    section = _section("A change that moves money")
    after = section[section.index("An operator's balance adjustment") :]
    table = "\n".join(line for line in after.splitlines() if line.startswith("| `"))
    listed = {
        path for path in re.findall(r"`([\w/.]+\.(?:py|lua|sql))`", table) if not path.startswith(("tests/", "docs/"))
    }
    letters = "|".join(k.letter for k in KINDS.values() if k.entry_type == "adjustment")
    names = re.compile(rf"adjustment|KIND_ADJUST|\b(?:{letters}) = [{{']", re.I)  # a row of a Lua table by letter
    naming = {
        str(path.relative_to(REPO))
        for top in ("functions", "layers", "infra")
        for path in (REPO / top).rglob("*")
        if path.suffix in (".py", ".lua", ".sql") and names.search(path.read_text())
    }
    assert naming == listed
