"""A damaged newest checkpoint does not burn the restarts: the controller
resumes from the newest checkpoint that verifies and says which it skipped
and why, or from the step asked for with --resume-from; nothing is deleted.
A --resume-from step that is not there or does not verify is refused
before anything starts, every run and checkpoint left as it was."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import HELLO, SCRIPTS, cli, flip_a_byte, meshrun
from errors_page import covers, exits, raises, snapshot

from meshrun import CheckpointError, RunConfig, Trainer, _native

SCRIPT = str(SCRIPTS / "resume_steps.py")


def files(folder: Path) -> dict[str, str]:
    """Every file of a folder and a hash of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def resumed(run_dir: Path, attempt: int) -> list:
    return [json.loads((run_dir / f"resumed-{attempt}-{rank}.json").read_text())["step"] for rank in (0, 1)]


def steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("step-")) for p in (run_dir / "checkpoints").glob("step-*"))


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_skipped_named_and_left_as_it_was(runs):
    first = meshrun(["-n", "2", "--tee", "none", SCRIPT, "3"], runs_dir=runs)
    assert first.code == 0, first.stderr
    newest = first.run_dir / "checkpoints" / "step-3"
    flip_a_byte(newest / "rank-1.safetensors")
    before = files(newest)

    again = meshrun(["-n", "2", "--tee", "none", SCRIPT, "0"], runs_dir=runs)
    assert again.code == 0, again.stderr
    assert resumed(again.run_dir, 2) == [2, 2]
    line = next(x for x in again.stderr.splitlines() if x.startswith("meshrun: checkpoint step-3 skipped: "))
    assert "checksum mismatch in '" in line and "step-3/rank-1.safetensors'" in line, line
    assert line.endswith("; resuming from step-2"), line
    skipped = [e for e in again.events() if e["event"] == "checkpoint_skipped"]
    assert [(e["attempt"], e["step"], e["resume_step"]) for e in skipped] == [(2, 3, 2)]
    assert "checksum mismatch" in skipped[0]["reason"] and skipped[0]["path"] == str(newest)
    assert [(e["step"], e["requested"]) for e in again.events() if e["event"] == "resuming"] == [(2, False)]
    assert files(newest) == before, "the damaged checkpoint was changed"
    assert steps(again.run_dir) == [1, 2, 3]


@pytest.mark.slow
def test_a_checkpoint_damaged_during_the_run_costs_one_restart_only(runs):
    # Attempt 1 saves steps 1-3, damages step 3 and fails; attempt 2 skips
    # step 3, resumes from step 2 and saves 3-5: the damaged copy of step 3
    # is set aside, not replaced, and retention does not touch it.
    done = meshrun(["-n", "2", "--tee", "none", "--max-failures", "1", "--keep-checkpoints", "2", SCRIPT, "3", "damage"], runs_dir=runs)
    assert done.code == 0, done.stderr
    assert resumed(done.run_dir, 1) == [None, None]
    assert resumed(done.run_dir, 2) == [2, 2]
    line = next(x for x in done.stderr.splitlines() if x.startswith("meshrun: checkpoint step-3 skipped: "))
    assert "checksum mismatch" in line and "step-3/rank-0.safetensors'" in line and line.endswith("; resuming from step-2"), line
    assert [e["step"] for e in done.events() if e["event"] == "checkpoint_skipped"] == [3]
    assert steps(done.run_dir) == [4, 5]
    kept = done.run_dir / "checkpoints" / "damaged-step-3"
    assert sorted(p.name for p in kept.iterdir()) == ["manifest.json", "rank-0.safetensors", "rank-1.safetensors"]
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        _native.CheckpointReader(str(kept)).verify()
    assert "damaged checkpoint step-3 set aside as '" in done.stderr


@pytest.mark.slow
def test_resume_from_an_older_step_sets_the_newer_ones_aside(runs):
    first = meshrun(["-n", "2", "--tee", "none", SCRIPT, "3"], runs_dir=runs)
    assert first.code == 0, first.stderr
    root = first.run_dir / "checkpoints"
    before = {step: files(root / f"step-{step}") for step in (2, 3)}

    back = meshrun(["-n", "2", "--tee", "none", "--resume-from", "1", SCRIPT, "1"], runs_dir=runs)
    assert back.code == 0, back.stderr
    assert resumed(back.run_dir, 2) == [1, 1]
    assert steps(back.run_dir) == [1, 2]
    for step in (2, 3):
        assert files(root / f"superseded-step-{step}") == before[step], f"step {step} was changed"
    moved = [(e["step"], Path(e["moved_to"]).name) for e in back.events() if e["event"] == "checkpoint_set_aside"]
    assert moved == [(2, "superseded-step-2"), (3, "superseded-step-3")]
    assert [(e["step"], e["requested"]) for e in back.events() if e["event"] == "resuming"] == [(1, True)]
    assert "meshrun: checkpoint step-3 set aside as '" in back.stderr

    # A later start under the same name carries on from the new step 2,
    # not from the abandoned step 3.
    later = meshrun(["-n", "2", "--tee", "none", SCRIPT, "0"], runs_dir=runs)
    assert later.code == 0, later.stderr
    assert resumed(later.run_dir, 3) == [2, 2]


# Rows of docs/errors.md: --resume-from (RunConfig.resume_from) of a step
# that cannot be resumed from.

@covers("run-resume-from-missing-step", "run-resume-from-no-checkpoints", "py-resume-from-missing-step")
def test_resume_from_a_step_that_is_not_there(split_checkpoint, finished_run):
    runs = split_checkpoint.parents[2]
    before, before_two = snapshot(runs), snapshot(finished_run)
    exits("run-resume-from-missing-step", cli("run", "--runs-dir", runs, "--name", "ck", "--resume-from", "999", HELLO))
    exits("run-resume-from-no-checkpoints", cli("run", "--runs-dir", finished_run, "--name", "two", "--resume-from", "1", HELLO))
    raises("py-resume-from-missing-step", lambda: Trainer(lambda: None, run_config=RunConfig(name="ck", storage_path=str(runs), resume_from=999)).fit())
    assert snapshot(runs) == before and snapshot(finished_run) == before_two, "a refused resume changed a run"


@covers("run-resume-from-damaged")
def test_resume_from_a_step_that_does_not_verify(split_checkpoint, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(split_checkpoint.parents[1], runs / "ck")
    flip_a_byte(runs / "ck" / "checkpoints" / "step-3" / "rank-0.safetensors")
    before = snapshot(runs)
    exits("run-resume-from-damaged", cli("run", "--runs-dir", runs, "--name", "ck", "--resume-from", "3", HELLO))
    assert snapshot(runs) == before, "the refused run changed the run or its checkpoint"


@covers("run-resume-none-verifies")
def test_a_run_whose_every_checkpoint_is_damaged_does_not_start_over(split_checkpoint, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(split_checkpoint.parents[1], runs / "ck")
    flip_a_byte(runs / "ck" / "checkpoints" / "step-3" / "rank-0.safetensors")
    before = snapshot(runs / "ck" / "checkpoints")
    done = meshrun(["-n", "2", "--tee", "none", HELLO], runs_dir=runs, name="ck")
    exits("run-resume-none-verifies", done)
    assert snapshot(runs / "ck" / "checkpoints") == before, "a checkpoint was moved or changed"
    assert not [e for e in done.events() if e["event"] == "worker_started" and e["attempt"] == 2], "the run started over"
