"""Seeing a run: goodput that accounts for the wall time (with a failure
injected), the run commands on a real run, the live progress bar on a
terminal, and TensorBoard event files read back by TensorBoard itself."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import time

import pytest
from conftest import MESHRUN, ROOT, SCRIPTS, assert_none_left, cli, meshrun, read_jsonl, start, stop, wait_for

GPT = str(ROOT / "examples" / "gpt.py")
DIGITS = str(ROOT / "examples" / "digits_dp.py")
TINY = ["--batch-size", "8", "--seq-len", "32", "--d-model", "32", "--layers", "1", "--heads", "4", "--eval-every", "10", "--eval-batches", "1", "--fsdp", "2", "--tensor", "2", "--steps", "30"]
PARTS = ("startup", "compile", "restore", "data", "step", "checkpoint", "lost", "other")


@pytest.fixture(scope="module")
def failed_once(tmp_path_factory, gpt_data):
    """The GPT with a checkpoint every 5 steps; rank 1 SIGKILLed after step
    12, then resumed. Returns (runs dir, wall time seen from outside)."""
    base = tmp_path_factory.mktemp("observe")
    runs = base / "runs"
    run_dir = runs / "g"
    t0 = time.monotonic()
    proc = start(["-n", "2", "--devices-per-proc", "2", "--checkpoint-every", "5", "--max-failures", "1", "--quiet", "--tee", "none", GPT, *TINY, "--data-dir", gpt_data], runs_dir=runs, name="g")
    try:
        wait_for(lambda: proc.poll() is not None or any((r["step"] or 0) >= 12 for r in read_jsonl(run_dir / "metrics.jsonl")), 180, "step 12")
        assert proc.poll() is None, proc.communicate()[1]
        pid = next(e["pid"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "worker_started" and e["rank"] == 1)
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        stop(proc)
    outside = time.monotonic() - t0
    assert proc.returncode == 0, err
    assert_none_left(run_dir)
    return runs, outside


@pytest.mark.slow
def test_goodput_parts_account_for_the_wall_time_and_the_failure(failed_once):
    runs, outside = failed_once
    g = json.loads((runs / "g" / "goodput.json").read_text())
    wall, secs = g["wall_s"], g["seconds"]
    assert all(secs[p] >= 0 for p in PARTS), secs
    assert abs(sum(secs[p] for p in PARTS) - wall) <= 0.02 * wall, (secs, wall)
    assert abs(sum(g["fractions"][p] for p in PARTS) - 1.0) <= 0.02
    # The controller's clock covers the run as seen from outside, less the
    # command's own start and exit: a fixed cost (an interpreter's start and
    # imports, the report written at the end), not a share of the run. It
    # was 1.7 s of a 34 s run on a loaded machine, where a bound of 5% of
    # the run failed.
    assert outside - 4.0 <= wall <= outside, (wall, outside)
    for part in ("startup", "compile", "data", "step", "checkpoint", "lost", "restore"):
        assert secs[part] > 0, f"{part} is 0: {secs}"
    first, second = g["attempts"]
    assert first["state"] == "failed" and first["seconds"]["lost"] > 0
    assert second["state"] == "succeeded" and second["seconds"]["lost"] > 0, "the restart gap is lost to the failure"
    assert second["seconds"]["restore"] > 0 and first["seconds"]["restore"] == 0
    assert second["seconds"]["step"] > 0


@pytest.mark.slow
def test_status_ls_and_logs_on_a_real_run(failed_once):
    runs, _ = failed_once
    ls = cli("ls", "--runs-dir", str(runs))
    assert ls.returncode == 0, ls.stderr
    header, row = ls.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "STATE", "ATTEMPTS", "STEP", "LOSS", "DURATION"]
    assert row.split()[:4] == ["g", "succeeded", "2", "30"]
    status = cli("status", "g", "--runs-dir", str(runs))
    assert status.returncode == 0, status.stderr
    assert "rank 1 ended with signal 9" in status.stdout
    shares = [float(line.split()[1].rstrip("%")) for line in status.stdout.splitlines() if line.strip().split(" ")[0] in PARTS and "%" in line]
    assert len(shares) == len(PARTS) and abs(sum(shares) - 100) < 2, status.stdout
    logs = cli("logs", "g", "--runs-dir", str(runs), "--rank", "1", "--attempt", "2")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.startswith("===== meshrun attempt 2, rank 1,") and "attempt 1" not in logs.stdout
    every = cli("logs", "g", "--runs-dir", str(runs), "--follow")
    assert every.returncode == 0 and "meshrun attempt 1, rank 0" in every.stdout and "meshrun attempt 2, rank 0" in every.stdout
    bad = cli("logs", "g", "--runs-dir", str(runs), "--rank", "5")
    assert bad.returncode == 2 and "has no log for rank 5 (it has ranks 0 to 1)" in bad.stderr
    missing = cli("status", "nope", "--runs-dir", str(runs))
    assert missing.returncode == 2 and f"no run named 'nope' in {runs}" in missing.stderr


def on_terminal(cmd: list[str], timeout: float = 240) -> tuple[int, str]:
    """Runs ``cmd`` with stdout and stderr on a pseudo-terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=ROOT)
    os.close(slave)
    drawn = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            drawn.extend(chunk)
        return proc.wait(timeout=30), drawn.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_progress_bar_on_a_terminal_and_quiet(tmp_path):
    def command(name: str, program: list[str], *flags: str) -> list[str]:
        return [str(MESHRUN), "run", "--runs-dir", str(tmp_path / "runs"), "--name", name, *flags, "-n", "2", "--platform", "cpu", *program]

    code, drawn = on_terminal(command("bar", [DIGITS, "--steps", "150"]))
    assert code == 0, drawn[-2000:]
    assert "attempt 1 · step " in drawn and "/150 · loss " in drawn and " steps/s" in drawn and "ETA " in drawn, drawn[-2000:]
    # Rank 0's own lines reach the terminal whole, above the bar.
    lines = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn).replace("\r", "\n").splitlines()
    assert any(line.startswith("step  100  loss ") for line in lines) and any("test accuracy" in line for line in lines), drawn[-2000:]
    # --quiet draws no bar where one would be drawn (a program without JAX
    # that reports 12 steps, 0.1 s apart, costs a fraction of the digits').
    paced = [str(SCRIPTS / "paced_loss.py"), "12", "0.1"]
    code, drawn = on_terminal(command("paced", paced))
    assert code == 0 and re.search(r"attempt 1 · step \d+ · loss ", drawn), drawn[-2000:]
    code, drawn = on_terminal(command("quiet", paced, "--quiet"))
    assert code == 0 and "attempt 1 · step" not in drawn, drawn[-2000:]


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_reported_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    done = meshrun(["-n", "2", "--platform", "cpu", "--tee", "none", "--tensorboard", DIGITS, "--steps", "50"], runs_dir=tmp_path / "runs", name="tb")
    assert done.code == 0, done.stderr
    events = EventAccumulator(str(done.run_dir / "tensorboard"))
    events.Reload()
    assert {"loss", "test_accuracy"} <= set(events.Tags()["scalars"])
    want = {r["step"]: r["metrics"]["loss"] for r in done.metrics() if "loss" in r["metrics"]}
    got = {e.step: e.value for e in events.Scalars("loss")}
    assert got.keys() == want.keys() and len(got) == 50
    assert max(abs(got[s] - want[s]) for s in want) < 1e-6
    record = json.loads((done.run_dir / "run.json").read_text())
    assert record["plan"]["tensorboard"] is True


def three_steps():
    import meshrun

    for step in range(1, 4):
        meshrun.report({"step": step, "loss": 1.0 / step}, total_steps=3)


def test_trainer_run_config_writes_tensorboard_without_progress(tmp_path):
    import meshrun
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = meshrun.Trainer(
        three_steps,
        scaling_config=meshrun.ScalingConfig(num_workers=2),
        run_config=meshrun.RunConfig(name="fit", storage_path=str(tmp_path / "runs"), tee="none", tensorboard=True, progress=False),
    ).fit()
    assert result.status == "succeeded", result.error
    events = EventAccumulator(str(tmp_path / "runs" / "fit" / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("loss")] == [(1, 1.0), (2, 0.5), (3, round(1 / 3, 6))]
    assert (tmp_path / "runs" / "fit" / "report.html").exists()
