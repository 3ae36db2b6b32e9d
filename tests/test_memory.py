"""Memory per worker: the limit (`--memory-per-proc`), a rank that runs
out named with what its state needs and what would fit, and each rank's
memory in `status`, the report and the events."""

from __future__ import annotations

import json
import os
import signal

import pytest
from conftest import HELLO, SCRIPTS, cli, meshrun, read_jsonl
from errors_page import covers, exits, raises
from test_serve import serve, status_of

import meshrun as mr

OOM = str(SCRIPTS / "oom_rank.py")

# Holds 96 MiB and reports until its agent's sample of it (every 2 s) is in
# the run's memory.jsonl (this machine's run folder), for at most 60 s.
HOLD = """
import json, os, time
import numpy as np
import meshrun

held = np.ones(96 << 20, dtype=np.uint8)
rank = int(os.environ["MESHRUN_RANK"])
path = os.path.join(os.environ["MESHRUN_RUN_DIR"], "memory.jsonl")

def sampled():
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        return False
    for line in lines:
        try:
            ranks = json.loads(line)["ranks"]
        except ValueError:
            continue  # a line still being written
        if any(m["rank"] == rank and m["current"] > 96 << 20 for m in ranks):
            return True
    return False

deadline = time.monotonic() + 60
step = 0
while not sampled():
    assert time.monotonic() < deadline, f"rank {rank}: no sample of its memory in 60 s"
    meshrun.report({"step": step})
    step += 1
    time.sleep(0.05)
"""
LIMIT = 512 << 20


def failure(run_dir):
    return json.loads((run_dir / "run.json").read_text())["attempts"][-1]["failure"]


@covers("memory-out-of-memory")
@pytest.mark.slow
def test_a_rank_past_its_limit_is_named_and_the_other_is_not(runs):
    done = meshrun(["-n", "2", "--memory-per-proc", "512MiB", OOM, "1"], runs_dir=runs)
    exits("memory-out-of-memory", done)
    f = failure(done.run_dir)
    assert (f["rank"], f["cause"]["kind"], f["cause"]["how"]) == (1, "out_of_memory", "killed"), f
    assert f["cause"]["limit"] == LIMIT and f["cause"]["peak"] >= LIMIT * 0.9, f
    # The other rank was stopped by meshrun, not said to have run out.
    assert "rank 0 stopped by meshrun" in done.stderr, done.stderr
    assert done.stderr.count("ran out of memory") == 1
    ended = [e for e in done.events() if e["event"] == "attempt_ended"][-1]
    by_rank = {m["rank"]: m for m in ended["memory"]}
    assert sorted(by_rank) == [0, 1] and all(m["limit"] == LIMIT for m in by_rank.values()), ended
    assert by_rank[1]["peak"] >= LIMIT * 0.9 > by_rank[0]["peak"], ended


@covers("memory-resource-exhausted")
@pytest.mark.slow
def test_xla_refusing_an_allocation_is_named_the_same_way(runs):
    done = meshrun(["-n", "2", "--memory-per-proc", "512MiB", OOM, "0", "xla"], runs_dir=runs)
    exits("memory-resource-exhausted", done)
    f = failure(done.run_dir)
    assert (f["rank"], f["cause"]["kind"], f["cause"]["how"]) == (0, "out_of_memory", "allocation"), f
    # The exception's traceback is the summary's, down to the program's line.
    assert "oom_rank.py" in f["cause"]["traceback"] and "last lines of rank 0's traceback" in done.stderr


@covers("memory-limit-not-settable")
def test_a_limit_the_host_cannot_set_ends_the_run_saying_why(runs):
    done = meshrun(["-n", "1", "--memory-per-proc", "512MiB", "--max-failures", "3", HELLO], runs_dir=runs, env={"MESHRUN_CGROUP": "0"})
    exits("memory-limit-not-settable", done)
    # The same on every attempt: none is tried again.
    assert len(json.loads((done.run_dir / "run.json").read_text())["attempts"]) == 1


@covers("memory-size-unreadable", "memory-size-too-small", "memory-size-negative", "memory-size-no-unit-fraction", "memory-size-too-small-k", "memory-size-ambiguous")
def test_sizes_that_cannot_be_limits_are_refused(tmp_path):
    for row, size in (
        ("memory-size-unreadable", "lots"),
        ("memory-size-too-small", "512KiB"),
        ("memory-size-ambiguous", "2560M"),
        ("memory-size-negative", "-1"),
        ("memory-size-no-unit-fraction", "1.5"),
        ("memory-size-too-small-k", "1kB"),
    ):
        exits(row, cli("run", "--runs-dir", tmp_path / "runs", "--memory-per-proc", size, HELLO))
    assert not (tmp_path / "runs").exists()


@covers("py-memory-per-worker-unreadable")
def test_a_python_size_that_cannot_be_read_is_refused(tmp_path):
    trainer = mr.Trainer(lambda: None, scaling_config=mr.ScalingConfig(memory_per_worker="lots"), run_config=mr.RunConfig(storage_path=str(tmp_path / "runs")))
    raises("py-memory-per-worker-unreadable", trainer.fit)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_each_ranks_memory_is_in_status_and_the_report(runs, tmp_path):
    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    done = meshrun(["-n", "2", "--memory-per-proc", "1GiB", str(script)], runs_dir=runs)
    assert done.code == 0, done.stderr
    lines = read_jsonl(done.run_dir / "memory.jsonl")
    seen = {m["rank"] for line in lines for m in line["ranks"]}
    assert seen == {0, 1}, lines
    status = cli("status", "t", "--runs-dir", runs)
    assert status.returncode == 0, status.stderr
    section = status.stdout.split("ranks' memory", 1)[1]
    assert "limit 1.00 GiB per worker" in section.splitlines()[0]
    rows = [line.split() for line in section.splitlines()[2:4]]
    assert [r[0] for r in rows] == ["0", "1"], section
    # Each holds its 96 MiB array and the interpreter: more than that, well under the limit.
    for r in rows:
        peak = float(r[4]) if r[5] == "MiB" else float(r[4]) * 1024
        assert 96 < peak < 1024, section
    report = cli("report", "t", "--runs-dir", runs)
    assert report.returncode == 0, report.stderr
    page = (done.run_dir / "report.html").read_text()
    assert 'id="memory"' in page and 'id="chart-memory-0"' in page and 'id="chart-memory-1"' in page
    assert "rank 1: peak" in page and "of 1.00 GiB" in page
    # The live page is the report's, redrawn as memory.jsonl grows.
    proc, found = serve(runs)
    try:
        code, live = status_of(f"http://{found.group(1)}:{found.group(2)}/runs/t")
        assert code == 200 and 'id="chart-memory-1"' in live
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)


def test_on_cuda_the_limit_is_xlas_share_of_the_workers_gpu(monkeypatch, tmp_path):
    from meshrun import _gpu_memory

    assert _gpu_memory.fraction(2 << 30, 80 << 30) == "0.0250"
    assert _gpu_memory.fraction(100 << 30, 80 << 30) == "1.0000"
    for name in (_gpu_memory.FRACTION, _gpu_memory.PREALLOCATE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MESHRUN_MEMORY_PER_PROC", str(2 << 30))
    monkeypatch.setenv("MESHRUN_GPUS", "3")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert _gpu_memory.apply() is None and _gpu_memory.FRACTION not in os.environ, "on cpu the limit is the cgroup's"
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    # No nvidia-smi on this machine's PATH here: the share cannot be worked out, and the log says so.
    monkeypatch.setenv("PATH", str(tmp_path))
    said = _gpu_memory.apply()
    assert said == "meshrun: the size of GPU 3 could not be read (nvidia-smi); --memory-per-proc is not set in XLA"
    assert os.environ[_gpu_memory.PREALLOCATE] == "false" and _gpu_memory.FRACTION not in os.environ
    monkeypatch.setenv(_gpu_memory.FRACTION, "0.5")
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 set by the program is kept" in _gpu_memory.apply()


@pytest.mark.slow
def test_a_trainer_puts_its_workers_under_memory_per_worker(tmp_path):
    runs = tmp_path / "runs"

    def train():
        import meshrun

        meshrun.report({"loss": 1.0})

    result = mr.Trainer(
        train,
        scaling_config=mr.ScalingConfig(num_workers=2, memory_per_worker="768MiB"),
        run_config=mr.RunConfig(name="limited", storage_path=str(runs)),
    ).fit()
    assert result.error is None
    ended = [e for e in read_jsonl(runs / "limited" / "events.jsonl") if e["event"] == "attempt_ended"][-1]
    assert [(m["rank"], m["limit"]) for m in ended["memory"]] == [(0, 768 << 20), (1, 768 << 20)], ended
