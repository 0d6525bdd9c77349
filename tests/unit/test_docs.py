"""The docs against the code: the README stays a door (short, its links and first calls true), and docs/ names every
setting, error code, route and alarm, with the generated tables as the generator writes them now."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from infra import gen_docs

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = (REPO / "README.md").read_text()
DOC_FILES = (
    "architecture.md",
    "guarantees.md",
    "api.md",
    "configuration.md",
    "operations.md",
    "performance.md",
    "testing.md",
    "adding-a-feature.md",
)


def doc(name: str) -> str:
    return (DOCS / name).read_text()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_is_a_door_of_at_most_200_lines():
    assert len(README.splitlines()) <= 200


def test_every_doc_the_readme_promises_exists_and_the_readme_links_it():
    for name in DOC_FILES:
        assert (DOCS / name).is_file(), name
        assert f"(docs/{name})" in README, name


@pytest.mark.parametrize("source", ["README.md", *(f"docs/{name}" for name in DOC_FILES)])
def test_links_between_the_docs_reach_a_file_and_a_heading(source):
    path = REPO / source
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{source}: {target}"
        if anchor:
            assert anchor in anchors(linked.read_text()), f"{source}: {target}"


def test_every_setting_is_in_the_configuration_doc():
    from hotledger import config

    configuration = doc("configuration.md")
    missing = [var for var in config.ENV.values() if f"`{var}`" not in configuration]
    assert missing == []


def test_every_error_code_is_in_the_api_doc_with_its_status():
    api = doc("api.md")
    codes = gen_docs.error_codes()
    assert len(codes) > 40  # the collection itself works
    for code, statuses in codes.items():
        rows = [line for line in api.splitlines() if f"| `{code}` |" in line]
        assert rows, code
        assert {int(s) for s in rows[0].split("|")[1].split(",")} == statuses, code


def test_every_route_is_in_the_api_doc():
    from api.app import openapi_json

    api = doc("api.md")
    documented = set(re.findall(r"^\| (GET|POST|PUT|PATCH|DELETE) \| `([^`]+)` \|", api, re.M))
    in_openapi = {
        (method.upper(), path)
        for path, operations in json.loads(openapi_json())["paths"].items()
        for method in operations
    }
    in_router = {(method, path) for method, path, _, _ in gen_docs.routes()}
    assert len(in_openapi) > 40
    assert in_openapi <= in_router
    assert in_router - documented == set()


class _Template(yaml.SafeLoader):
    """template.yaml with CloudFormation's short tags (!Ref, !Sub ...) read as plain values."""


_Template.add_multi_constructor("!", lambda loader, tag, node: None)


def alarms() -> list[str]:
    resources = yaml.load((REPO / "template.yaml").read_text(), Loader=_Template)["Resources"]
    return [name for name, resource in resources.items() if resource.get("Type") == "AWS::CloudWatch::Alarm"]


def test_every_alarm_has_a_runbook_entry():
    operations = doc("operations.md")
    runbook = operations[operations.index("## Runbook") :]
    names = alarms()
    assert len(names) > 20
    entries = set(re.findall(r"^#### (\w+)$", runbook, re.M))
    assert set(names) - entries == set()
    for name in names:  # each entry says what it means, what to look at and what to do
        entry = runbook[runbook.index(f"#### {name}\n") :]
        entry = entry[: entry.find("\n#", 5) if "\n#" in entry[5:] else len(entry)]
        for part in ("**Means**", "**Look at", "**Do**"):
            assert part in entry or (part != "**Means**" and "**Look at / Do**" in entry), (name, part)


def test_operations_keeps_the_operator_console_section():
    assert "## Operator console" in doc("operations.md")


def test_the_generated_sections_are_what_the_generator_writes_now():
    stale = [
        str(path.relative_to(REPO)) for path, (now, generated) in gen_docs.regenerate().items() if now != generated
    ]
    assert stale == [], "run: python infra/gen_docs.py"


def _readme_calls() -> list[tuple[str, str, str]]:
    """(method, path, the answer line under it) for each curl in the README followed by an answer."""
    calls, lines = [], README.splitlines()
    for i, line in enumerate(lines):
        match = re.search(r"curl -s .*?(?:-X(\w+) )?.*?'?localhost:3000(/[^\s'?]*)", line)
        if not match:
            continue
        method = re.search(r"-X(\w+)", line)
        answer = lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith("# ") else ""
        calls.append(((method.group(1) if method else "GET"), match.group(2), answer[2:]))
    return calls


def _route_of(method: str, path: str, paths: dict) -> tuple[str, dict]:
    for template, operations in paths.items():
        pattern = "^" + re.sub(r"\\\{\w+\\\}", r"[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path) and method.lower() in operations:
            return template, operations[method.lower()]
    raise AssertionError(f"the README calls {method} {path}, which is no route")


def test_the_readme_calls_are_routes_and_their_answers_have_the_routes_fields():
    from api.app import openapi_json

    document = json.loads(openapi_json())
    calls = _readme_calls()
    assert len(calls) >= 10
    codes = gen_docs.error_codes()
    for method, path, answer in calls:
        template, operation = _route_of(method, path, document["paths"])
        if not answer.strip():
            continue
        status = re.match(r"(\d{3}) ", answer)
        body = answer[status.end() :] if status else answer
        if not body.startswith("{"):
            continue
        keys = set(re.findall(r'"(\w+)": ', body))
        if status and body.startswith('{"message": '):  # the front door's JWT authorizer's own refusal
            assert status.group(1) == "401" and body.startswith('{"message": "Unauthorized"}'), (method, path, body)
            continue
        if status:
            code = re.search(r'"code": "(\w+)"', body).group(1)
            assert int(status.group(1)) in codes[code], (method, path, code)
            assert status.group(1) in operation["responses"], (method, path, status.group(1))
            continue
        answered = next(operation["responses"][s] for s in ("200", "201") if s in operation["responses"])
        schema = answered["content"]["application/json"]["schema"]
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]] if "$ref" in schema else schema
        assert keys <= set(schema["properties"]), (method, template, keys - set(schema["properties"]))
        if "..." not in body and "…" not in body:
            assert set(schema.get("required", [])) <= keys, (method, template)


def test_every_make_target_has_a_help_line_and_help_lists_them_all():
    import subprocess

    makefile = (REPO / "Makefile").read_text().splitlines()
    rules = [(i, line.split(":")[0]) for i, line in enumerate(makefile) if re.match(r"^[a-z][a-z-]*:", line)]
    targets = [target for _, target in rules]
    undocumented = [target for i, target in rules if not makefile[i - 1].startswith("## ")]
    assert undocumented == []
    listed = [
        line.split()[0]
        for line in subprocess.run(
            ["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.splitlines()
    ]
    assert listed == targets
