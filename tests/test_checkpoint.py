"""Checkpoints across processes: saved with one layout, restored with
another, every dtype bitwise; corruption is caught and named, and every
checkpoint row of docs/errors.md (a damaged file, a target that does not
match) leaves the checkpoint as it was."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import MESHRUN, SCRIPTS, assert_none_left, cli, flip_a_byte, meshrun, read_jsonl, start, stop, wait_for
from errors_page import CATALOGUE, covers, exits, raises, says, snapshot

from meshrun import checkpoint

SCRIPT = str(SCRIPTS / "ckpt_roundtrip.py")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    runs = tmp_path_factory.mktemp("ckpt") / "runs"
    done = meshrun(["-n", "2", "--devices-per-proc", "2", "--tee", "none", SCRIPT, "save", "2", "1"], runs_dir=runs, name="ck")
    assert done.code == 0, done.stderr
    committed = [e for e in done.events() if e["event"] == "checkpoint_committed"]
    assert [e["step"] for e in committed] == [5]
    assert (done.run_dir / "checkpoints" / "step-5" / "manifest.json").exists()
    assert not list((done.run_dir / "checkpoints").glob("tmp-*"))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("launch, mesh", [(["-n", "1", "--devices-per-proc", "4"], ["1", "4"]), (["-n", "4"], ["2", "1"])])
def test_restore_onto_another_layout(saved, launch, mesh):
    done = meshrun([*launch, "--tee", "none", SCRIPT, "restore", *mesh], runs_dir=saved, name="ck")
    assert done.code == 0, done.stderr
    for path in done.run_dir.glob("restored-*.json"):
        rec = json.loads(path.read_text())
        assert rec == {"step": 5, "ok": {"w": True, "b16": True, "ids": True}, "metrics": {"loss": 1.5}}


def test_flipped_byte_is_caught_naming_file_and_tensor(saved, tmp_path):
    import shutil

    from meshrun import CheckpointError, _native

    copy = tmp_path / "step-5"
    shutil.copytree(saved / "ck" / "checkpoints" / "step-5", copy)
    assert _native.CheckpointReader(str(copy)).verify() > 0
    # With data=2 x fsdp=2, process 0 holds every replica-0 shard of the
    # global arrays; process 1's file holds only its own copies of the
    # per-process (numpy) leaves.
    manifest = json.loads((copy / "manifest.json").read_text())
    of_rank_1 = {leaf["path"] for leaf in manifest["leaves"] for s in leaf["shards"] if s["file"] == "rank-1.safetensors"}
    assert of_rank_1 == {"bytes", "nested/mask", "nested/step"}, of_rank_1
    assert all(s.get("rank") == 1 for leaf in manifest["leaves"] for s in leaf["shards"] if s["file"] == "rank-1.safetensors")
    shard = copy / "rank-0.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-5] ^= 0x01  # inside the last tensor's data
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"checksum mismatch in '.*rank-0\.safetensors', tensor '"):
        _native.CheckpointReader(str(copy)).verify()


def ckpt_cli(*args):
    import subprocess

    from conftest import MESHRUN

    return subprocess.run([str(MESHRUN), "ckpt", *map(str, args)], capture_output=True, text=True, timeout=60)


def test_ckpt_cli_ls_inspect_verify_export(saved, tmp_path):
    import numpy as np
    from safetensors import safe_open

    step = saved / "ck" / "checkpoints" / "step-5"
    ls = ckpt_cli("ls", "ck", "--runs-dir", saved)
    assert ls.returncode == 0 and ls.stdout.split("\n")[0].split() == ["STEP", "LEAVES", "BYTES", "PATH"]
    assert ["5", "6", "855", str(step)] in [line.split() for line in ls.stdout.splitlines()], ls.stdout
    inspect = ckpt_cli("inspect", step)
    assert inspect.returncode == 0
    assert 'metrics: {"loss":1.5}' in inspect.stdout
    assert "w\tfloat32\t[8, 16]\t512\t2" in inspect.stdout
    assert "total: 6 leaves, 855 bytes" in inspect.stdout
    assert "every CRC matches" in ckpt_cli("verify", step).stdout
    out = tmp_path / "model.safetensors"
    assert ckpt_cli("export", step, out).returncode == 0
    with safe_open(str(out), framework="numpy") as f:
        assert sorted(f.keys()) == ["b16", "bytes", "ids", "nested/mask", "nested/step", "w"]
        np.testing.assert_array_equal(f.get_tensor("w"), np.arange(128, dtype=np.float32).reshape(8, 16) / 7)
        np.testing.assert_array_equal(f.get_tensor("ids"), np.arange(16, dtype=np.int32).reshape(4, 4) - 5)
        assert f.get_slice("b16").get_dtype() == "BF16"  # numpy has no bfloat16; the data is there for torch/jax
    missing = ckpt_cli("ls", "nope", "--runs-dir", saved)
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr
    uncommitted = ckpt_cli("verify", tmp_path)
    assert uncommitted.returncode == 2 and "has no manifest.json: it is not a committed checkpoint" in uncommitted.stderr


@pytest.mark.parametrize(
    "flags, kept",
    [
        (["--keep-checkpoints", "2", "--keep-every-n-steps", "3"], [3, 5, 6]),
        (["--keep-checkpoints", "1", "--checkpoint-score", "loss", "--checkpoint-score-order", "min"], [2, 6]),
        ([], [1, 2, 3, 4, 5, 6]),
    ],
)
@pytest.mark.slow
def test_retention_after_each_commit(tmp_path, flags, kept):
    losses = ["5", "1", "4", "3", "2", "6"]
    done = meshrun(["-n", "2", "--devices-per-proc", "2", *flags, str(SCRIPTS / "save_steps.py"), *losses], runs_dir=tmp_path / "runs", name="keep")
    assert done.code == 0, done.stderr
    steps = sorted(int(p.name.removeprefix("step-")) for p in (done.run_dir / "checkpoints").glob("step-*"))
    assert steps == kept
    assert [e["step"] for e in done.events() if e["event"] == "checkpoint_committed"] == [1, 2, 3, 4, 5, 6]


def test_retention_flags_are_checked(tmp_path):
    import subprocess

    from conftest import MESHRUN

    proc = subprocess.run([str(MESHRUN), "run", "--runs-dir", str(tmp_path / "runs"), "--keep-checkpoints", "0", str(SCRIPTS / "hello.py")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--keep-checkpoints must be at least 1" in proc.stderr
    assert not (tmp_path / "runs").exists()


def committed_steps(run_dir):
    root = run_dir / "checkpoints"
    return sorted(int(p.name.removeprefix("step-")) for p in root.glob("step-*") if (p / "manifest.json").exists())


# The soak's short form: 4 rounds under make bench-smoke, 20 under make soak.
@pytest.mark.bench_smoke
def test_sigkill_at_random_points_of_saves_never_loses_the_newest_commit(runs):
    """Kills a worker or the controller itself with SIGKILL at random
    moments of back-to-back saves (each rank writes 8 MiB per step, so
    nearly every moment is inside a save or commit), many times. After each
    kill the newest committed checkpoint verifies; the next start removes
    every uncommitted folder before any rank saves, and restores that
    newest checkpoint with every value checked (in the job). Four rounds
    kill rank 0, rank 1, the controller and rank 1 again; `make soak` runs
    20."""
    rounds = int(os.environ.get("MESHRUN_KILL_ROUNDS", "4"))
    seed = int(os.environ.get("MESHRUN_KILL_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    name, run_dir = "kills", runs / "kills"
    job = [str(SCRIPTS / "save_until_killed.py"), "8"]
    args = ["-n", "2", "--platform", "cpu", "--tee", "none", "--keep-checkpoints", "2"]
    newest_after_kill = []
    for i in range(rounds):
        proc = start([*args, *job, "100000"], runs_dir=runs, name=name)
        try:
            wait_for(lambda: proc.poll() is not None or all(len(read_jsonl(run_dir / f"verified-{r}.jsonl")) > i for r in (0, 1)), 90, f"round {i} (seed {seed}) to restore")
            assert proc.poll() is None, f"seed {seed}, round {i}: the run ended before it was killed: {proc.communicate()[1]}"
            # Saves follow each other from the first commit of the attempt
            # on (a loaded machine may take seconds to get there): a moment
            # after it is inside a save or a commit.
            committed = lambda: [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "checkpoint_committed" and e["attempt"] == i + 1]  # noqa: E731
            wait_for(lambda: proc.poll() is not None or committed(), 90, f"round {i} (seed {seed}) to commit")
            time.sleep(rng.uniform(0.05, 1.0))
            if i % 3 == 2:
                victim = proc.pid
            else:
                victim = next(e["pid"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "worker_started" and e["attempt"] == i + 1 and e["rank"] == i % 2)
            os.kill(victim, signal.SIGKILL)
            proc.communicate(timeout=30)
        finally:
            stop(proc)
        assert_none_left(run_dir)
        steps = committed_steps(run_dir)
        newest_after_kill.append(steps[-1] if steps else None)
        if steps:
            check = subprocess.run([str(MESHRUN), "ckpt", "verify", str(run_dir / "checkpoints" / f"step-{steps[-1]}")], capture_output=True, text=True)
            assert check.returncode == 0, f"seed {seed}, round {i}: {check.stdout}{check.stderr}"
    final = meshrun([*args, *job, "2"], runs_dir=runs, name=name)
    assert final.code == 0, final.stderr
    for r in (0, 1):
        starts = read_jsonl(run_dir / f"verified-{r}.jsonl")
        assert [s["restored"] for s in starts[1:]] == newest_after_kill, f"seed {seed}: rank {r} restored {starts}"
        assert all(s["leftover"] == [] for s in starts), f"seed {seed}: uncommitted folders survived a start: {starts}"
    assert not list((run_dir / "checkpoints").glob("tmp-*"))
    discarded = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "checkpoint_discarded"]
    print(f"seed {seed}: {rounds} kills, newest committed after each: {newest_after_kill}; {len(discarded)} uncommitted folders removed at restarts")
    assert sum(s is not None for s in newest_after_kill) >= rounds - 1, f"seed {seed}: too few commits to test anything: {newest_after_kill}"


def test_a_tree_too_large_for_one_message_is_a_clear_error(runs):
    done = meshrun(["-n", "1", "--tee", "all", str(SCRIPTS / "too_many_leaves.py")], runs_dir=runs)
    assert done.code == 0, done.stderr
    assert "refused: step 1: this rank's shard list and metadata take" in done.stdout
    assert "bytes a control message carries" in done.stdout
    assert not list((done.run_dir / "checkpoints").glob("step-*"))


# Rows of docs/errors.md, on copies of one committed checkpoint whose leaf
# 'w' is split over two ranks' files.

@pytest.fixture
def ckpt(split_checkpoint, tmp_path):
    copy = tmp_path / "step-3"
    shutil.copytree(split_checkpoint, copy)
    return copy


TARGET = {"w": np.zeros((8, 4), np.float32), "b": np.zeros((4,), np.float32)}


@covers("ckpt-not-a-checkpoint", "ckpt-verify-corrupt")
def test_ckpt_verify_of_a_folder_and_of_a_corrupt_checkpoint(ckpt, tmp_path):
    exits("ckpt-not-a-checkpoint", cli("ckpt", "verify", tmp_path))
    flip_a_byte(ckpt / "rank-0.safetensors")
    before = snapshot(ckpt)
    exits("ckpt-verify-corrupt", cli("ckpt", "verify", ckpt))
    assert snapshot(ckpt) == before


def restore_fails(row: str, path: Path, target=TARGET) -> None:
    before = snapshot(path)
    raises(row, lambda: checkpoint.restore(target, path))
    assert snapshot(path) == before, "restoring changed the checkpoint"


@covers("ckpt-missing-shard")
def test_restore_with_a_shard_missing(ckpt):
    (ckpt / "rank-1.safetensors").unlink()
    restore_fails("ckpt-missing-shard", ckpt)


@covers("ckpt-bad-crc")
def test_restore_with_a_flipped_byte(ckpt):
    flip_a_byte(ckpt / "rank-0.safetensors")
    restore_fails("ckpt-bad-crc", ckpt)


@covers("ckpt-shard-truncated")
def test_restore_with_a_shard_cut_short(ckpt):
    shard = ckpt / "rank-0.safetensors"
    shard.write_bytes(shard.read_bytes()[:40])
    restore_fails("ckpt-shard-truncated", ckpt)


@covers("ckpt-shape-mismatch", "ckpt-dtype-mismatch", "ckpt-leaf-missing")
def test_restore_onto_a_tree_that_does_not_match(ckpt):
    restore_fails("ckpt-shape-mismatch", ckpt, {**TARGET, "w": np.zeros((8, 8), np.float32)})
    restore_fails("ckpt-dtype-mismatch", ckpt, {**TARGET, "w": np.zeros((8, 4), np.float64)})
    restore_fails("ckpt-leaf-missing", ckpt, {**TARGET, "v": np.zeros(2, np.float32)})
    restored = checkpoint.restore(TARGET, ckpt)
    np.testing.assert_array_equal(restored["w"], np.arange(32, dtype=np.float32).reshape(8, 4))


@covers("ckpt-manifest-damaged")
def test_restore_with_a_damaged_manifest(ckpt):
    (ckpt / "manifest.json").write_text("{not json")
    restore_fails("ckpt-manifest-damaged", ckpt)


@covers("ckpt-not-committed")
def test_restore_of_a_folder_that_is_not_a_checkpoint(tmp_path):
    restore_fails("ckpt-not-committed", tmp_path)


def test_a_checkpoint_flag_the_program_gives_no_state_to_is_warned_about_once(runs):
    done = meshrun(["-n", "2", "--tee", "all", "--checkpoint-every", "2", str(SCRIPTS / "steady_reporter.py"), "10"], runs_dir=runs, env={"MESHRUN_INDEPENDENT": "1"})
    assert done.code == 0, done.stderr
    warning = "meshrun: warning: --checkpoint-every 2 was given, but the program has passed no state to meshrun.report(checkpoint=...) by step 4: that flag saves only such a state, so it does nothing here"
    terminal = done.stdout + done.stderr
    assert terminal.count("--checkpoint-every 2 was given") == 1, terminal
    assert f"[0] {warning}" in terminal
    assert warning in done.log(0) and "was given" not in done.log(1)


@pytest.fixture(scope="module")
def in_one_attempt(tmp_path_factory) -> dict[int, dict]:
    """What each rank's saves, waits and restores in one attempt gave
    (scripts/wait_committed.py), by rank and phase."""
    runs = tmp_path_factory.mktemp("wait") / "runs"
    done = meshrun(["-n", "2", "--tee", "none", str(SCRIPTS / "wait_committed.py")], runs_dir=runs, name="w")
    assert done.code == 0, done.stderr + done.log(0)[-3000:]
    return {rank: json.loads((done.run_dir / f"result-{rank}.json").read_text()) for rank in (0, 1)}


def raised(row: str, got: dict) -> None:
    """A phase of the script raised the row's exception, with its message."""
    assert got.get("raised") == CATALOGUE[row][1], got
    says(row, got["message"])


def test_restore_right_after_save_gives_what_was_saved(in_one_attempt):
    for rank in (0, 1):
        assert in_one_attempt[rank]["newest"] == {"restored": 1}, in_one_attempt[rank]["newest"]


def test_wait_committed_returns_the_committed_step(in_one_attempt):
    for rank in (0, 1):
        got = in_one_attempt[rank]["waited"]
        assert got.get("step") == 2 and got["restored"] == 2 and got["path"].endswith("/checkpoints/step-2"), got


@covers("ckpt-wait-not-committed")
def test_waiting_on_a_step_a_rank_could_not_write_says_why(in_one_attempt):
    for rank in (0, 1):
        got = in_one_attempt[rank]["refused"]
        raised("ckpt-wait-not-committed", got)
        assert "Is a directory" in got["message"], got
        # The newest checkpoint is still step 2, and restoring it waits for
        # nothing more.
        assert got["restored"] == 2


@covers("ckpt-wait-timeout")
def test_waiting_past_the_timeout_says_so(in_one_attempt):
    got = in_one_attempt[0]["timeout"]
    raised("ckpt-wait-timeout", got)
    assert 0.5 <= got["waited"] < 5, got


@covers("ckpt-wait-nothing-saved")
def test_waiting_before_any_save_says_to_save_first(in_one_attempt):
    for rank in (0, 1):
        raised("ckpt-wait-nothing-saved", in_one_attempt[rank]["nothing"])


@covers("ckpt-wait-timeout-not-positive")
def test_wait_committed_takes_a_positive_timeout():
    import meshrun as mr

    raises("ckpt-wait-timeout-not-positive", lambda: mr.wait_committed(timeout=0))

