"""The mutant list of `make mutants` (infra/mutants.py) cannot silently rot: every mutant names a file that exists,
an original snippet found exactly once in it (so the mutant still mutates what it says), a replacement that
changes it, and test paths that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.mutants import MUTANTS, REPO, apply

IDS = [mu.id for mu in MUTANTS]


def test_the_list_is_curated_and_large_enough():
    assert len(MUTANTS) >= 25
    assert len(set(IDS)) == len(IDS), "mutant ids are unique"


@pytest.mark.parametrize("mutant", MUTANTS, ids=IDS)
def test_each_original_occurs_exactly_once(mutant):
    path = REPO / mutant.file
    assert path.is_file(), f"{mutant.file} does not exist"
    assert mutant.file.startswith(("layers/lua/", "functions/")) or mutant.file == "template.yaml"  # the front door
    text = path.read_text()
    assert text.count(mutant.original) == 1, (
        f"{mutant.id}: the original snippet occurs {text.count(mutant.original)} times in {mutant.file}; "
        "update the mutant together with the code"
    )
    assert mutant.replacement != mutant.original
    assert mutant.breaks.strip()


@pytest.mark.parametrize("mutant", MUTANTS, ids=IDS)
def test_each_names_tests_that_exist(mutant):
    assert mutant.tests
    for test in mutant.tests:
        file = test.split("::")[0]
        assert file.startswith(("tests/unit/", "tests/integration/")), test
        assert (REPO / file).is_file(), f"{mutant.id}: {file} does not exist"


def test_apply_changes_only_the_snippet(tmp_path: Path):
    mutant = MUTANTS[0]
    (tmp_path / mutant.file).parent.mkdir(parents=True)
    source = (REPO / mutant.file).read_text()
    (tmp_path / mutant.file).write_text(source)
    assert apply(tmp_path, mutant) == source
    mutated = (tmp_path / mutant.file).read_text()
    assert mutated == source.replace(mutant.original, mutant.replacement) and mutated != source
