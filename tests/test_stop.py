"""`meshrun stop NAME` from another shell: a checkpoint first (as on
SIGTERM), or at once with --now; authenticated by the run's token."""

from __future__ import annotations

import json
import subprocess

from conftest import MESHRUN, ROOT, SCRIPTS, assert_none_left, read_jsonl, start, stop, wait_for

LOOP = str(SCRIPTS / "checkpoint_loop.py")


def stop_cmd(runs, name, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([str(MESHRUN), "stop", "--runs-dir", str(runs), *flags, name], capture_output=True, text=True, timeout=120, cwd=ROOT)


def reported(run_dir, step: int):
    return lambda: any((r["step"] or 0) >= step for r in read_jsonl(run_dir / "metrics.jsonl"))


def test_stop_saves_a_checkpoint_then_ends_the_run(runs):
    proc = start(["-n", "2", "--checkpoint-every", "1000", LOOP], runs_dir=runs, name="s")
    run_dir = runs / "s"
    try:
        wait_for(reported(run_dir, 3), 60, "training")
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


def test_stop_now_ends_the_run_without_a_checkpoint(runs):
    proc = start(["-n", "2", "--checkpoint-every", "1000", LOOP], runs_dir=runs, name="n")
    run_dir = runs / "n"
    try:
        wait_for(reported(run_dir, 3), 60, "training")
        asked = stop_cmd(runs, "n", "--now")
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert asked.returncode == 0, asked.stderr
    assert proc.returncode == 128 + 15, err
    assert not [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "checkpoint_committed"]
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"
    assert_none_left(run_dir)


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
        wait_for(reported(run_dir, 2), 60, "training")
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
