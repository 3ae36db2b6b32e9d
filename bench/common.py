"""What the benchmark scripts share: a free loopback port for hand launches,
reading a run's files while it writes them, waiting, and one way to print a
table and save the figures."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> dict[str, Any]:
    """When, on what commit and on what machine state a figure was
    measured: the date, the checkout's commit (and whether it had
    changes), the cores, the load averages and the memory available as the
    benchmark ends (a load near the core count means something else ran
    beside it)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "unknown"

    available = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available = round(int(line.split()[1]) / 2**20, 1)
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "changed": git("status", "--porcelain", "--untracked-files=no") not in ("", "unknown"),
        "cores": os.cpu_count(),
        "load": [round(x, 2) for x in os.getloadavg()],
        "memory_available_gib": available,
    }


def publish(title: str, header: tuple[str, str], rows: list[tuple[str, str]], summary: str, result: dict[str, Any], json_path: Path | None) -> None:
    """Prints a markdown table under ``title``, then ``summary`` and the
    machine's state (``machine``); writes ``result`` as JSON, with that
    state under ``"machine"``."""
    state = machine()
    print(title)
    print(f"| {header[0]} | {header[1]} |")
    print("| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print(summary)
    changed = " with changes" if state["changed"] else ""
    load = " / ".join(map(str, state["load"]))
    print(f"Measured {state['date']} at {state['commit']}{changed}: {state['cores']} cores, load {load}, {state['memory_available_gib']} GiB available.")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({**result, "machine": state}, indent=2))


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
