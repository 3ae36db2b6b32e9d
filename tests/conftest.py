"""Helpers shared by the end-to-end tests: run the real ``meshrun`` command
on real scripts, read what it wrote, and check that no process it started
is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
MESHRUN = Path(sys.executable).parent / "meshrun"
HELLO = str(SCRIPTS / "hello.py")


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str
    run_dir: Path | None

    def events(self) -> list[dict]:
        return read_jsonl(self.run_dir / "events.jsonl")

    def metrics(self) -> list[dict]:
        return read_jsonl(self.run_dir / "metrics.jsonl")

    def log(self, rank: int) -> str:
        return (self.run_dir / "logs" / f"rank-{rank}.log").read_text()


def read_jsonl(path: Path) -> list[dict]:
    """The file's whole lines, those its newline ends: a run still going
    may have written part of its next line (a buffered writer flushes where
    its buffer fills), and that part is no record yet."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def started_pids(run_dir: Path) -> list[int]:
    """Every worker and agent process the run recorded."""
    pids = []
    for e in read_jsonl(run_dir / "events.jsonl"):
        if e["event"] in ("worker_started", "agent_joined"):
            pids.append(e["pid"])
    return pids


def assert_none_left(run_dir: Path, own_pid: int | None = None, timeout: float = 5.0) -> None:
    pids = [p for p in started_pids(run_dir) if p != own_pid and p != os.getpid()]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    left = [p for p in pids if alive(p)]
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def meshrun(args: list[str], *, runs_dir: Path, name: str | None = "t", timeout: float = 240, env: dict | None = None, cwd: Path | None = None, check_left: bool = True) -> Finished:
    """Runs ``meshrun run`` to completion."""
    cmd = [str(MESHRUN), "run", "--runs-dir", str(runs_dir)]
    if name is not None:
        cmd += ["--name", name]
    proc = subprocess.run(
        cmd + args,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd or ROOT,
    )
    run_dir = runs_dir / name if name is not None else None
    if check_left and run_dir is not None and run_dir.exists():
        assert_none_left(run_dir)
    return Finished(proc.returncode, proc.stdout, proc.stderr, run_dir)


def cli(*args, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs any ``meshrun`` command (``ls``, ``status``, ``ckpt verify``, a
    refused ``run``) to completion."""
    return subprocess.run([str(MESHRUN), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd, env={**os.environ, **(env or {})})


def start(args: list[str], *, runs_dir: Path, name: str, env: dict | None = None) -> subprocess.Popen:
    """Starts ``meshrun run`` in the background (for signal tests)."""
    return subprocess.Popen(
        [str(MESHRUN), "run", "--runs-dir", str(runs_dir), "--name", name, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


def stopped(pid: int) -> bool:
    """True once every thread of the process is stopped (SIGSTOP)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
    except FileNotFoundError:
        return False
    return bool(states) and all(s in "Tt" for s in states)


def freeze_agent_and_kill_worker(agent: int, worker: int) -> None:
    """SIGSTOPs an agent and SIGKILLs a worker, and returns once the agent
    is stopped and the worker gone. kill() returns before the signal takes
    effect, so what either was doing (a checkpoint being committed, an old
    step being removed) could otherwise still touch its files afterwards."""
    os.kill(agent, signal.SIGSTOP)
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: stopped(agent), 10, f"agent {agent} to stop")
    wait_for(lambda: not alive(worker), 10, f"worker {worker} to die")


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def stop(proc: subprocess.Popen) -> None:
    """Test cleanup: stop a meshrun we started, by its handle."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)


def flip_a_byte(shard: Path) -> None:
    """Damages a checkpoint shard the way a bad disk would: one bit of the
    last tensor's data, the file's size and header intact."""
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0x01
    shard.write_bytes(bytes(raw))


# Runs that several feature files' error tests read and must leave as they
# were (each such test compares a snapshot of them before and after), made
# once per session.

@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A runs directory holding 'two': a finished 2-process run that saved
    no checkpoint."""
    runs = tmp_path_factory.mktemp("finished") / "runs"
    done = meshrun(["-n", "2", "--tee", "none", HELLO], runs_dir=runs, name="two")
    assert done.code == 0, done.stderr
    return runs


@pytest.fixture(scope="session")
def split_checkpoint(tmp_path_factory) -> Path:
    """Step 3 of run 'ck': a committed checkpoint whose leaf 'w' is split
    over two ranks' files."""
    runs = tmp_path_factory.mktemp("split-checkpoint") / "runs"
    done = meshrun(["-n", "2", "--tee", "none", str(SCRIPTS / "save_split.py")], runs_dir=runs, name="ck")
    assert done.code == 0, done.stderr
    path = done.run_dir / "checkpoints" / "step-3"
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "rank-0.safetensors", "rank-1.safetensors"]
    return path


# Hosts that share nothing (network, /tmp, scratch), made on this machine
# with namespaces: see nshosts.py.

@pytest.fixture
def nshosts():
    """Factory: ``nshosts(count, **options)`` returns an open ``NsHosts``;
    skips the test where namespaces cannot be made, and closes every
    harness it made at teardown, whatever the test did."""
    from nshosts import NsHosts, nshosts_unavailable

    reason = nshosts_unavailable()
    if reason is not None:
        pytest.skip(f"no network namespaces: {reason}")
    made = []

    def make(count: int, **options) -> NsHosts:
        hosts = NsHosts(count, **options)
        made.append(hosts)
        return hosts

    yield make
    for hosts in made:
        hosts.close()


# A real S3 server (SeaweedFS) on loopback: see s3server.py.

@pytest.fixture(scope="session")
def s3server(tmp_path_factory):
    """One SeaweedFS S3 server for the session's tests; each takes a bucket
    of its own (``s3_bucket``). Tests that kill a server make their own
    with ``S3Server``."""
    from s3server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3server")).start()
    yield server
    server.close()


_buckets = iter(range(1, 10_000))


@pytest.fixture
def s3_bucket(s3server) -> str:
    """A fresh bucket on the session's S3 server: its URL (s3://NAME)."""
    return s3server.bucket(f"meshrun-test-{next(_buckets)}")


def _run_wide(tmp_path_factory, name: str) -> Path:
    """A folder that every worker of the test run shares (`make test` runs
    pytest-xdist workers, each with a base folder of its own under a
    common one), made by whichever asks first."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def _session_compile_cache(tmp_path_factory) -> Path:
    # Shared by the run's workers: JAX writes each entry atomically, as it
    # does for the processes of one job.
    return _run_wide(tmp_path_factory, "compile-cache")


@pytest.fixture(autouse=True)
def _own_scratch(request, tmp_path_factory, monkeypatch, _session_compile_cache):
    """Every test's hosts get a scratch folder of their own (the runs'
    host-local files live there): no test finds what another left. Memory
    checkpoints likewise: a folder of the test's own, removed with its
    temporary files, so a killed run leaves none in shared memory.

    The compilation cache is the session's: the same small programs are
    compiled by test after test, and a cached executable is the one a
    compile would give (JAX keys it by the program, the devices, the flags
    and its own version), so no result depends on it. Tests of the cache
    itself, or of where meshrun puts it, are marked ``own_compile_cache``
    and get meshrun's default (the scratch folder's). Hosts that share
    nothing see it too (nshosts.py keeps it visible at its path in their
    private /tmp): it is the one thing of the test session they share."""
    monkeypatch.setenv("MESHRUN_SCRATCH", str(tmp_path_factory.mktemp("scratch")))
    monkeypatch.setenv("MESHRUN_MEMORY_DIR", str(tmp_path_factory.mktemp("memory")))
    if request.node.get_closest_marker("own_compile_cache") is None:
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(_session_compile_cache))
    else:
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)


@pytest.fixture(scope="session")
def gpt_data(tmp_path_factory) -> str:
    """examples/gpt.py's corpus, built once for the session by the example's
    own ``build_corpus`` (every run would otherwise read the standard
    library again: seconds per test). Runs only read it."""
    import runpy

    from filelock import FileLock

    out = _run_wide(tmp_path_factory, "gpt-data")
    # Built by the first worker to ask; the others wait for it.
    with FileLock(str(out) + ".lock"):
        build = runpy.run_path(str(ROOT / "examples" / "gpt.py"), run_name="gpt_corpus")["build_corpus"]
        build(out)  # nothing to do once it is there
    return str(out)


# The tiny sharded GPT that the restart tests compare against an
# uninterrupted run: 2 processes x 2 devices, fsdp 2 x tensor 2. One layer:
# what the tests check (restarts, data order, layouts, hosts) is the same
# with two, and a step of two layers takes some 330 collectives where one
# takes half as many; between processes each is a few loopback TCP
# messages, and a step of two layers cost 0.2 CPU-seconds against 0.08.
GPT = str(ROOT / "examples" / "gpt.py")
GPT_TINY = ["--batch-size", "8", "--seq-len", "32", "--d-model", "32", "--layers", "1", "--heads", "4", "--eval-every", "100000", "--eval-batches", "1", "--fsdp", "2", "--tensor", "2"]
GPT_LAUNCH = ["-n", "2", "--devices-per-proc", "2", "--tee", "none"]


@dataclass
class Reference:
    """An uninterrupted run of the GPT: its final parameters' digest, the
    sample ids each rank read (``rank-<r>.jsonl`` under ``samples``) and
    its loss at each step."""

    digest: str
    samples: Path
    losses: dict[int, float]


@pytest.fixture(scope="session")
def gpt_reference(tmp_path_factory, gpt_data):
    """``reference(*args)``: the uninterrupted GPT_LAUNCH run of
    examples/gpt.py with ``args`` on the session's corpus, run once for the
    whole test run by whichever worker asks first and shared by every
    test that asks with the same arguments. A restarted run is bit for bit
    the uninterrupted one on the same processes and devices, whatever its
    checkpoint settings, hosts or storage, so tests of restarts compare
    against one reference instead of each training its own."""
    import hashlib
    import shutil

    from filelock import FileLock

    root = _run_wide(tmp_path_factory, "gpt-references")

    def reference(*args: str) -> Reference:
        key = hashlib.sha256(json.dumps(args).encode()).hexdigest()[:16]
        out = root / key
        with FileLock(str(out) + ".lock"):
            if not (out / "done").exists():
                shutil.rmtree(out, ignore_errors=True)
                (out / "samples").mkdir(parents=True)
                ran = meshrun([*GPT_LAUNCH, GPT, *args, "--data-dir", gpt_data, "--sample-log", str(out / "samples"), "--params-digest", str(out / "params.sha")], runs_dir=out / "runs", name="ref", timeout=900)
                assert ran.code == 0, ran.stderr + ran.log(0)[-2000:]
                (out / "done").write_text(json.dumps(args))
        losses = {r["step"]: r["metrics"]["loss"] for r in read_jsonl(out / "runs" / "ref" / "metrics.jsonl") if "loss" in r["metrics"]}
        return Reference((out / "params.sha").read_text(), out / "samples", losses)

    return reference


# Benchmark short forms run under `make bench-smoke` (pytest --bench-smoke),
# not `make test`: they keep the benchmark scripts working, and measure
# nothing a test asserts on beyond that.
def pytest_addoption(parser):
    parser.addoption("--bench-smoke", action="store_true", help="run only the benchmark short forms (marked bench_smoke)")


# XLA's CPU backend at optimization level 0 for every process the tests
# start (set before any starts, so Ray nodes and hosts in namespaces carry
# it too): a tiny GPT's train step compiles in about a third of the time
# (4.0 s against 12.8 s on 2 cores) and no test asserts on how fast XLA's
# code runs, only on what meshrun does with it; every run a test compares
# (a reference, a restart, another layout) is compiled the same way. The
# benchmarks' short forms keep XLA's default: they time things.
SUITE_XLA_FLAG = "--xla_backend_optimization_level=0"


def pytest_configure(config):
    if not config.getoption("--bench-smoke") and SUITE_XLA_FLAG not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SUITE_XLA_FLAG}".strip()


# Under `make test`'s workers (pytest-xdist, a file to a worker at a
# time) the files that take longest start first, so that none is left for
# the end to keep one worker busy while the other idles. Measured on 2
# cores; a file missing here only starts later. test_ray.py stays before
# test_ray_gpus.py (see its fixture).
LONGEST_FIRST = [
    "test_ray.py", "test_hosts_apart.py", "test_elastic.py", "test_s3.py", "test_gpt.py",
    "test_launcher.py", "test_observe.py", "test_recovery.py", "test_memory_tier.py", "test_checkpoint.py", "test_maxtext.py",
    "test_digits.py", "test_profiles.py", "test_data_storage.py", "test_executables.py", "test_from_ray.py", "test_save_outage.py",
]


def pytest_collection_modifyitems(config, items):
    smoke = config.getoption("--bench-smoke")
    keep = [item for item in items if (item.get_closest_marker("bench_smoke") is not None) == smoke]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
    if os.environ.get("PYTEST_XDIST_WORKER"):
        first = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: first.get(item.path.name, len(first)))
