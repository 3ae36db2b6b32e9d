"""What the benchmark scripts share: a free loopback port for hand launches,
reading a run's files while it writes them, waiting, and one way to print a
table and save the figures."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def publish(title: str, header: tuple[str, str], rows: list[tuple[str, str]], summary: str, result: dict[str, Any], json_path: Path | None) -> None:
    """Prints a markdown table under ``title``, then ``summary``; writes ``result`` as JSON."""
    print(title)
    print(f"| {header[0]} | {header[1]} |")
    print("| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print(summary)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2))


def jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file the run is still appending to: a last
    line caught half-written is skipped, as every reader of a run does."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")
