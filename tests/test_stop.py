"""`meshrun stop NAME` from another shell: a checkpoint first (as on
SIGTERM), or at once with --now; authenticated by the run's token."""

from __future__ import annotations

import json
import signal
import subprocess
import threading

import pytest
from conftest import MESHRUN, ROOT, SCRIPTS, assert_none_left, read_jsonl, start, stop, wait_for

import meshrun as mr

LOOP = str(SCRIPTS / "checkpoint_loop.py")


def stop_cmd(runs, name, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([str(MESHRUN), "stop", "--runs-dir", str(runs), *flags, name], capture_output=True, text=True, timeout=120, cwd=ROOT)


def reported(run_dir, step: int):
    return lambda: any((r["step"] or 0) >= step for r in read_jsonl(run_dir / "metrics.jsonl"))


@pytest.mark.slow
def test_stop_saves_a_checkpoint_then_ends_the_run(runs):
    proc = start(["-n", "2", "--checkpoint-every", "1000", LOOP], runs_dir=runs, name="s")
    run_dir = runs / "s"
    try:
        wait_for(lambda: proc.poll() is not None or reported(run_dir, 3)(), 60, "training")
        asked = stop_cmd(runs, "s")
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert asked.returncode == 0, asked.stderr
    assert "saves a checkpoint" in asked.stdout + asked.stderr
    assert "ended: preempted" in asked.stdout + asked.stderr
    assert proc.returncode == 75, err
    committed = [e["step"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "checkpoint_committed"]
    assert len(committed) == 1 and committed[0] >= 3
    assert json.loads((run_dir / "run.json").read_text())["state"] == "preempted"
    assert_none_left(run_dir)


@pytest.mark.slow
def test_stop_now_ends_the_run_as_stopped_without_a_checkpoint(runs):
    """A stop asked for is a stop, not a crash: its own line, state and
    exit status (3), in the terminal, run.json, `ls`, `status` and the
    stop command's answer."""
    proc = start(["-n", "2", "--checkpoint-every", "1000", LOOP], runs_dir=runs, name="n")
    run_dir = runs / "n"
    try:
        wait_for(lambda: proc.poll() is not None or reported(run_dir, 3)(), 60, "training")
        asked = stop_cmd(runs, "n", "--now")
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.splitlines()[-1] == "meshrun: run 'n' ended: stopped", asked.stdout
    assert proc.returncode == 3, err
    assert f"meshrun: run 'n' stopped by `meshrun stop --now`; every worker was stopped. Logs: {run_dir / 'logs'}\n" in err, err
    # JAX's own line about the SIGTERM its process got is not meshrun's.
    ours = [line for line in err.splitlines() if line.startswith("meshrun:")]
    assert not [line for line in ours if "interrupted" in line or "SIGTERM" in line], err
    assert not [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "checkpoint_committed"]
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["state"], [a["state"] for a in run["attempts"]]) == ("stopped", ["stopped"])
    listed = subprocess.run([str(MESHRUN), "ls", "--runs-dir", str(runs)], capture_output=True, text=True, timeout=60)
    assert listed.stdout.splitlines()[1].split()[:2] == ["n", "stopped"], listed.stdout
    status = subprocess.run([str(MESHRUN), "status", "--runs-dir", str(runs), "n"], capture_output=True, text=True, timeout=60)
    assert "state     stopped\n" in status.stdout, status.stdout
    assert_none_left(run_dir)


@pytest.mark.slow
def test_sigterm_to_meshrun_is_still_an_interruption_by_sigterm(runs):
    """Only a stop asked for with `meshrun stop` reads as one: SIGTERM to
    meshrun, with a program that saves no checkpoint, is an interruption
    by that signal (exit 128 + 15)."""
    proc = start(["-n", "2", str(SCRIPTS / "sleeper.py")], runs_dir=runs, name="sig")
    run_dir = runs / "sig"
    try:
        wait_for(lambda: proc.poll() is not None or all((run_dir / f"ready-{r}").exists() for r in (0, 1)), 90, "both ranks to start")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 128 + 15, err
    assert f"meshrun: run 'sig' interrupted by SIGTERM; every worker was stopped. Logs: {run_dir / 'logs'}\n" in err, err
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"
    assert_none_left(run_dir)


def _report_until_stopped():
    import time

    import meshrun

    for step in range(1, 100_000):
        meshrun.report({"loss": 1.0 / step})
        time.sleep(0.05)


def test_stop_now_of_a_trainer_fit_returns_a_stopped_result(tmp_path):
    """`Trainer.fit` stopped with `meshrun stop --now` returns (it does not
    raise) a result whose status says stopped, and whose error carries
    the same line as the command line's."""
    runs = tmp_path / "runs"
    asked: list[subprocess.CompletedProcess] = []

    def stop_it():
        wait_for(reported(runs / "fit", 3), 120, "training")
        asked.append(stop_cmd(runs, "fit", "--now"))

    stopper = threading.Thread(target=stop_it)
    stopper.start()
    try:
        result = mr.Trainer(_report_until_stopped, run_config=mr.RunConfig(name="fit", storage_path=str(runs), tee="none")).fit()
    finally:
        stopper.join(timeout=150)
    assert asked and asked[0].returncode == 0, asked and asked[0].stderr
    assert result.status == "stopped"
    assert isinstance(result.error, mr.RunFailedError)
    assert str(result.error).startswith("meshrun: run 'fit' stopped by `meshrun stop --now`; every worker was stopped."), result.error
def test_stop_of_a_run_that_is_not_running_says_so(runs):
    done = subprocess.run([str(MESHRUN), "run", "--runs-dir", str(runs), "--name", "over", "-n", "1", str(SCRIPTS / "hello.py")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0
    asked = stop_cmd(runs, "over")
    assert asked.returncode == 1
    assert "run 'over' is not running" in asked.stderr


def test_stop_with_a_wrong_token_is_refused(runs):
    proc = start(["-n", "1", "--checkpoint-every", "1000", LOOP], runs_dir=runs, name="w")
    run_dir = runs / "w"
    token = run_dir / "token"
    try:
        wait_for(lambda: proc.poll() is not None or reported(run_dir, 2)(), 60, "training")
        real = token.read_text()
        token.write_text("00" * 32)
        try:
            asked = stop_cmd(runs, "w")
        finally:
            token.write_text(real)
        assert asked.returncode == 1
        assert "the run's controller did not accept the token in" in asked.stderr
        assert proc.poll() is None, "a request with the wrong token stopped the run"
        assert stop_cmd(runs, "w", "--now").returncode == 0
        proc.communicate(timeout=60)
    finally:
        stop(proc)
