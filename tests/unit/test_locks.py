"""Locked dependencies (issue 23): every install reads a lock with hashes, and every requirement is in its lock (a
requirement added without `make lock` fails here, not at the next install)."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCKS = {"requirements-dev.txt": "requirements-dev.lock", "functions/requirements.txt": "functions/requirements.lock"}


def _names(requirements: Path) -> set[str]:
    names = set()
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(re.split(r"[\[<>=!~; ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def _pinned(lock: Path) -> dict[str, int]:
    """name -> how many hashes its pin carries."""
    pins, current = {}, None
    for line in lock.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==\S+", line)
        if match:
            current = match.group(1).lower().replace("_", "-")
            pins[current] = 0
        elif current and "--hash=sha256:" in line:
            pins[current] += 1
    return pins


@pytest.mark.parametrize("requirements,lock", LOCKS.items())
def test_every_requirement_is_pinned_with_hashes_in_its_lock(requirements, lock):
    pins = _pinned(REPO / lock)
    assert _names(REPO / requirements) - set(pins) == set(), f"run `make lock`: {requirements} changed"
    assert all(count > 0 for count in pins.values()), [name for name, count in pins.items() if not count]


def test_every_install_reads_a_lock_with_hashes():
    assert "--require-hashes --no-deps -r requirements-dev.lock" in (REPO / "infra/setup.sh").read_text()
    assert (
        "--require-hashes --no-deps" in (layer := (REPO / "functions/Makefile").read_text())
        and "requirements.lock" in layer
    )
