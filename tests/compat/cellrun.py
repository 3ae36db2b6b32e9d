"""What the compatibility suite's tests share (loaded as a pytest plugin,
see pytest.ini): the ``meshrun`` command of this venv, run to completion or
started in the background, what a run wrote, and the check that no process
it started is left behind.

The suite runs in a venv made by compat/cells.py, where meshrun is the
installed wheel: nothing here may come from the repository's python/.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).resolve().parent / "programs"
MESHRUN = Path(sys.executable).parent / "meshrun"


def pytest_configure(config) -> None:
    import meshrun

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    where = Path(meshrun.__file__).resolve()
    if site not in where.parents:
        raise pytest.UsageError(f"the compatibility suite must import meshrun from this venv's wheel ({site}), not {where}")
    if not MESHRUN.exists():
        raise pytest.UsageError(f"no meshrun command beside this Python: {MESHRUN}")


def pytest_report_header(config) -> list[str]:
    import jax
    import jaxlib

    import meshrun

    return [f"meshrun from {Path(meshrun.__file__).parent}; JAX {jax.__version__}, jaxlib {jaxlib.__version__}"]


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str
    run_dir: Path

    def events(self, kind: str | None = None) -> list[dict]:
        return [e for e in read_jsonl(self.run_dir / "events.jsonl") if kind is None or e["event"] == kind]

    def metrics(self) -> list[dict]:
        return read_jsonl(self.run_dir / "metrics.jsonl")

    def log(self, rank: int) -> str:
        return (self.run_dir / "logs" / f"rank-{rank}.log").read_text()

    def json(self, name: str) -> dict:
        return json.loads((self.run_dir / name).read_text())

    def why(self) -> str:
        """What to show when the run is not what a test expected."""
        logs = ""
        for rank in (0, 1):
            path = self.run_dir / "logs" / f"rank-{rank}.log"
            if path.exists():
                logs += f"\n--- rank {rank} ---\n{path.read_text()[-2500:]}"
        return f"exit {self.code}\n--- stderr ---\n{self.stderr[-3000:]}{logs}"


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def started_pids(run_dir: Path) -> list[int]:
    """Every worker and agent process the run recorded."""
    return [e["pid"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] in ("worker_started", "agent_joined")]


def kill_left(run_dir: Path, timeout: float = 10.0) -> list[int]:
    """Waits up to ``timeout`` for the run's processes to end; SIGKILLs those
    still there (only pids the run recorded) and returns them."""
    pids = [p for p in started_pids(run_dir) if p != os.getpid()]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    left = [p for p in pids if alive(p)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


class Meshrun:
    """``meshrun run`` of this venv, with its runs under ``runs``. Every run
    it starts is checked to leave no process behind, and whatever a failed
    test left running is ended when the test ends (``close``)."""

    def __init__(self, runs: Path, env: dict[str, str]) -> None:
        self.runs = runs
        self.env = env
        self.background: list[tuple[subprocess.Popen, Path]] = []

    def command(self, args: list[str], name: str) -> list[str]:
        return [str(MESHRUN), "run", "--runs-dir", str(self.runs), "--name", name, "--tee", "none", *map(str, args)]

    def __call__(self, args: list, *, name: str, env: dict | None = None, timeout: float = 240) -> Finished:
        """Runs ``meshrun run`` to completion."""
        proc = subprocess.Popen(
            self.command(args, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**self.env, **(env or {})}, cwd=self.runs.parent,
        )
        self.background.append((proc, self.runs / name))
        out, err = proc.communicate(timeout=timeout)
        self.background.remove((proc, self.runs / name))
        left = kill_left(self.runs / name)
        assert not left, f"run {name} left processes behind: {left}"
        return Finished(proc.returncode, out, err, self.runs / name)

    def start(self, args: list, *, name: str, env: dict | None = None) -> subprocess.Popen:
        """Starts ``meshrun run`` in the background."""
        proc = subprocess.Popen(
            self.command(args, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**self.env, **(env or {})}, cwd=self.runs.parent,
        )
        self.background.append((proc, self.runs / name))
        return proc

    def finish(self, proc: subprocess.Popen, timeout: float = 240) -> Finished:
        """Waits for a run started with ``start``."""
        run_dir = next(d for p, d in self.background if p is proc)
        out, err = proc.communicate(timeout=timeout)
        self.background.remove((proc, run_dir))
        left = kill_left(run_dir)
        assert not left, f"run {run_dir.name} left processes behind: {left}"
        return Finished(proc.returncode, out, err, run_dir)

    def close(self) -> None:
        for proc, run_dir in self.background:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
            kill_left(run_dir, timeout=0)
        self.background.clear()


def fresh_env(tmp: Path) -> dict[str, str]:
    """The environment of a run: this venv's, with a scratch folder (the
    compilation cache) and memory-checkpoint folder of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHRUN_", "JAX_", "XLA_"))}
    for name in ("scratch", "memory"):
        (tmp / name).mkdir(parents=True, exist_ok=True)
    env["MESHRUN_SCRATCH"] = str(tmp / "scratch")
    env["MESHRUN_MEMORY_DIR"] = str(tmp / "memory")
    return env


@pytest.fixture
def meshrun(tmp_path):
    """A ``Meshrun`` with runs, scratch and memory folders of the test's own."""
    runner = Meshrun(tmp_path / "runs", fresh_env(tmp_path))
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def module_meshrun(tmp_path_factory):
    """The same, shared by a module's tests (for runs several tests read)."""
    tmp = tmp_path_factory.mktemp("module")
    runner = Meshrun(tmp / "runs", fresh_env(tmp))
    yield runner
    runner.close()
