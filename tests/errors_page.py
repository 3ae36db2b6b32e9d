"""docs/errors.md as a test helper. Every row of the page is tested in the
test file of its feature, by a test decorated with ``@covers(row, ...)``;
the expected message, exit status or exception are read from the page
itself, so the page and the behaviour cannot drift apart.
``test_errors_page.py`` fails when a row has no test."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

import meshrun as mr

PAGE = Path(__file__).resolve().parent.parent / "docs" / "errors.md"


def read_catalogue() -> dict[str, tuple[str, str]]:
    """id -> (message, outcome) for every row of the page's tables."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) != 4 or not re.fullmatch(r"[a-z][a-z0-9-]*", cells[0]) or cells[0] == "id":
            continue
        message = cells[2]
        assert message.startswith("`` ") and message.endswith(" ``"), f"row {cells[0]}: the message must be a ``code span``"
        assert cells[0] not in rows, f"row {cells[0]} appears twice"
        rows[cells[0]] = (message[3:-3].replace("\\|", "|"), cells[3])
    return rows


CATALOGUE = read_catalogue()
# Filled by ``covers`` as the feature test files are imported.
TESTED: set[str] = set()


def covers(*rows: str):
    """Registers the rows of the page that a test (or a parametrized set of
    tests) checks."""
    TESTED.update(rows)
    return lambda f: f


def says(row: str, text: str) -> None:
    """``text`` holds the row's message: its parts between the '…' in order."""
    pos = 0
    for part in CATALOGUE[row][0].split("…"):
        found = text.find(part, pos)
        assert found >= 0, f"row {row}: expected {part!r} (after position {pos}) in:\n{text}"
        pos = found + len(part)


def exits(row: str, proc: subprocess.CompletedProcess | object) -> None:
    """The command ended with the row's exit status and said its message on stderr."""
    outcome = CATALOGUE[row][1]
    assert outcome.startswith("exit "), f"row {row} is not a command-line row"
    code = getattr(proc, "returncode", None)
    if code is None:
        code = proc.code
    assert code == int(outcome.split()[1]), f"row {row}: exit status {code}, expected {outcome}:\n{proc.stderr}"
    says(row, proc.stderr)


def raises(row: str, fn) -> None:
    """``fn()`` raises exactly the row's exception, with its message."""
    kind = {"ConfigError": mr.ConfigError, "DataError": mr.DataError, "CheckpointError": mr.CheckpointError, "StorageError": mr.StorageError, "TrainingFailedError": mr.TrainingFailedError, "TypeError": TypeError}[CATALOGUE[row][1]]
    with pytest.raises(Exception) as caught:
        fn()
    assert type(caught.value) is kind, f"row {row}: raised {type(caught.value).__name__}: {caught.value}"
    says(row, str(caught.value))


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and a hash of its bytes: what a refused
    command must leave as it was."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}
