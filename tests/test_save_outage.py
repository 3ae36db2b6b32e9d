"""A storage outage under `--on-save-error continue` is seen, not only
recorded: the terminal says once that saves are failing (with the cause)
and once that they are saved again, and `meshrun status` and the report
count the saves that failed."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import MESHRUN, SCRIPTS, assert_none_left, read_jsonl, start, stop, wait_for


def failed_steps(run_dir: Path) -> set[tuple[int, int]]:
    return {(e["attempt"], e["step"]) for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "checkpoint_failed"}


def commits(run_dir: Path) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "checkpoint_committed"]


def point(link: Path, target: Path) -> None:
    """Points the symlink `link` at `target` in one rename, so that no
    rank ever finds the path missing (and makes a directory of its own)."""
    tmp = link.with_name(link.name + ".next")
    os.symlink(target, tmp)
    os.replace(tmp, link)


@pytest.mark.slow
def test_saves_that_fail_for_a_while_are_told_once_and_counted(tmp_path):
    runs, name = tmp_path / "runs", "outage"
    run_dir = runs / name
    # The run's checkpoints folder is a symlink, so that the test can swap
    # the storage away (to a file: every save then fails with ENOTDIR, root
    # or not) and back, each in one step.
    real, blocker = tmp_path / "disk", tmp_path / "not-a-folder"
    real.mkdir()
    blocker.write_text("")
    checkpoints = tmp_path / "store" / name / "checkpoints"
    checkpoints.parent.mkdir(parents=True)
    os.symlink(real, checkpoints)
    proc = start(["-n", "2", "--tee", "none", "--checkpoint-every", "1", "--on-save-error", "continue", "--storage", str(tmp_path / "store"), str(SCRIPTS / "save_through_outage.py")], runs_dir=runs, name=name)
    try:
        wait_for(lambda: proc.poll() is not None or commits(run_dir), 120, "the first commit")
        assert proc.poll() is None, proc.communicate()[1]
        point(checkpoints, blocker)
        wait_for(lambda: proc.poll() is not None or len(failed_steps(run_dir)) >= 3, 60, "three failed saves")
        assert proc.poll() is None, proc.communicate()[1]
        back = time.time()
        point(checkpoints, real)
        wait_for(lambda: proc.poll() is not None or any(e["time"] > back for e in commits(run_dir)), 60, "a commit after the outage")
        (run_dir / "stop-now").write_text("")
        out, err = proc.communicate(timeout=120)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    assert_none_left(run_dir)

    failed = failed_steps(run_dir)
    lo, hi = min(s for _, s in failed), max(s for _, s in failed)
    lines = err.splitlines()
    failing = [line for line in lines if "checkpoint saves are failing" in line]
    again = [line for line in lines if "checkpoints are saving again" in line]
    assert len(failing) == 1, err
    assert len(again) == 1, err
    # The cause, as the rank met it, and which save it cost; or, where the
    # ranks had written their pieces before the swap, as the controller's
    # commit met it (the manifest it could not write).
    assert re.search(r"step-\d+ was not saved: (rank [01]: |cannot write '.*/manifest\.json': ).*Not a directory", failing[0]), failing[0]
    assert "training goes on" in failing[0], failing[0]
    assert lines.index(failing[0]) < lines.index(again[0]), err
    told = re.search(r"step-(\d+) committed after (\d+) failed save\(s\)", again[0])
    assert told and int(told.group(1)) > hi and 1 <= int(told.group(2)) <= len(failed), again[0]

    status = subprocess.run([str(MESHRUN), "status", name, "--runs-dir", str(runs)], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert re.search(r"^checkpoints  \d+ committed, newest step-\d+$", status.stdout, re.M), status.stdout
    assert f"{len(failed)} saves failed (steps {lo} to {hi}), the newest at step " in status.stdout, status.stdout
    # The outage is over: a save was committed after it.
    assert "none was committed since" not in status.stdout, status.stdout

    page = (run_dir / "report.html").read_text()
    assert f'<span class="failed">{len(failed)} failed</span>' in page
    assert f"{len(failed)} saves failed (steps {lo} to {hi})" in page


@pytest.mark.slow
def test_a_commit_held_for_20_s_holds_back_no_report_and_fails_no_rank(s3server, s3_bucket, tmp_path):
    """The controller's commit of a step (its manifest's PUT) is held for
    20 s by a proxy in front of the S3 server, while the ranks' own uploads
    pass. Commits run off the controller's loop: meanwhile the ranks'
    reports keep reaching metrics.jsonl and their heartbeats the
    controller, no rank is failed, and once the PUT goes through the held
    step commits, then the steps saved meanwhile, in order."""
    from s3fakes import HoldingProxy

    runs, name = tmp_path / "runs", "held"
    run_dir = runs / name
    with HoldingProxy(s3server.endpoint, "/manifest.json") as proxy:
        env = s3server.env(AWS_ENDPOINT_URL=proxy.endpoint)
        proc = start(["-n", "2", "--tee", "none", "--checkpoint-every", "1", "--storage", f"{s3_bucket}/runs", str(SCRIPTS / "save_through_outage.py")], runs_dir=runs, name=name, env=env)
        try:
            wait_for(lambda: proc.poll() is not None or commits(run_dir), 120, "the first commit")
            proxy.hold()
            wait_for(lambda: proc.poll() is not None or proxy.holding.is_set(), 60, "a commit to be held")
            held_at, held_unix = time.monotonic(), time.time()
            reports = lambda: len(read_jsonl(run_dir / "metrics.jsonl"))  # noqa: E731
            seen = [(0.0, reports())]
            while (waited := time.monotonic() - held_at) < 20:
                time.sleep(0.5)
                seen.append((waited, reports()))
            assert proc.poll() is None, proc.communicate()[1]
            proxy.release()
            wait_for(lambda: proc.poll() is not None or any(e["time"] > held_unix + 20 for e in commits(run_dir)), 60, "the held commit")
            (run_dir / "stop-now").write_text("")
            out, err = proc.communicate(timeout=120)
        finally:
            stop(proc)
    assert proc.returncode == 0, err
    # Reports came in all along: in each 5 s of the hold, several.
    for lo in (0, 5, 10, 15):
        during = [n for t, n in seen if lo <= t <= lo + 5]
        assert during[-1] - during[0] >= 5, f"reports recorded while the commit was held (seconds, lines): {seen}"
    events = read_jsonl(run_dir / "events.jsonl")
    assert not [e for e in events if e["event"] in ("worker_failed", "restarting", "checkpoint_failed")], [e["event"] for e in events]
    steps = [e["step"] for e in commits(run_dir)]
    assert steps == sorted(steps) and len(steps) == len(set(steps)), steps
    # The first commit after the hold began is the held step's: it came
    # once its PUT went through, and those saved meanwhile after it.
    after = [e for e in commits(run_dir) if e["time"] >= held_unix]
    assert len(after) >= 2 and after[0]["time"] > held_unix + 20, after[:3]
    assert_none_left(run_dir)


@pytest.mark.slow
def test_a_save_under_way_when_the_program_raises_is_committed_before_the_failure(s3server, s3_bucket, tmp_path):
    """The program reports step 3 with its state and raises at once, while
    a proxy holds its shards' upload until the traceback is in the rank's
    log. The rank lets the save finish before it reports the failure (the
    failure stops the group): step 3 is committed in attempt 1 and the
    restart resumes from it."""
    from s3fakes import HoldingProxy

    runs, name = tmp_path / "runs", "raised"
    run_dir = runs / name
    with HoldingProxy(s3server.endpoint, ".safetensors") as proxy:
        proxy.hold()
        env = s3server.env(AWS_ENDPOINT_URL=proxy.endpoint)
        proc = start(["-n", "1", "--tee", "none", "--max-failures", "1", "--storage", f"{s3_bucket}/runs", str(SCRIPTS / "raise_after_save.py")], runs_dir=runs, name=name, env=env)
        try:
            wait_for(lambda: proc.poll() is not None or proxy.holding.is_set(), 120, "the shards' upload to be held")
            # The upload goes on once the program has raised (its traceback
            # is in its log): the failure is then what the rank has to say.
            log = run_dir / "logs" / "rank-0.log"
            wait_for(lambda: proc.poll() is not None or (log.exists() and "RuntimeError: right after a save" in log.read_text()), 120, "the program to raise")
            proxy.release()
            out, err = proc.communicate(timeout=120)
        finally:
            stop(proc)
    assert proc.returncode == 0, err
    events = read_jsonl(run_dir / "events.jsonl")
    committed = [(e["attempt"], e["step"]) for e in events if e["event"] == "checkpoint_committed"]
    assert (1, 3) in committed, [e["event"] for e in events]
    restarting = [e for e in events if e["event"] == "restarting"]
    assert [e["from_step"] for e in restarting] == [3], restarting
    last = read_jsonl(run_dir / "metrics.jsonl")[-1]["metrics"]
    assert (last["resumed_from"], last["w"]) == (3, 6.0), last
