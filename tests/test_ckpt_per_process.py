"""Per-process leaves in a checkpoint (an array on one process's own
devices, a typed PRNG key, a numpy or Python number): every process saves
its own copy and gets it back, beside replicated and sharded leaves, and a
run killed after a checkpoint resumes bit-identical to one that was not.
A checkpoint that is whole but cannot be restored (the layout meshrun
committed before per-process leaves were kept apart) is named as such: it
is neither set aside as damaged nor skipped for a start from step 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import SCRIPTS, cli, meshrun
from errors_page import covers, exits, says, snapshot

from meshrun import CheckpointError, _native

SCRIPT = str(SCRIPTS / "per_process_state.py")
ARGS = ["-n", "2", "--devices-per-proc", "2", "--tee", "none"]
PER_PROCESS = ["count", "key", "scale", "seed", "vec"]


def finals(run_dir: Path) -> list[dict[str, np.ndarray]]:
    return [dict(np.load(run_dir / f"final-{rank}.npz")) for rank in (0, 1)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("per-process") / "runs"
    done = meshrun([*ARGS, SCRIPT, "6"], runs_dir=runs, name="whole")
    assert done.code == 0, done.stderr
    return done.run_dir


@pytest.mark.slow
def test_each_process_saves_and_gets_back_its_own_copy(uninterrupted):
    manifest = json.loads((uninterrupted / "checkpoints" / "step-6" / "manifest.json").read_text())
    leaves = {leaf["path"]: leaf for leaf in manifest["leaves"]}
    for name in PER_PROCESS:
        assert sorted(s["rank"] for s in leaves[name]["shards"]) == [0, 1], leaves[name]
    for name in ("w", "b"):
        assert all("rank" not in s for s in leaves[name]["shards"]), leaves[name]
    checked = cli("ckpt", "verify", uninterrupted / "checkpoints" / "step-6")
    assert checked.returncode == 0, checked.stderr
    ranks = finals(uninterrupted)
    # The copies differ from process to process.
    for name in ("vec", "seed", "key"):
        assert not np.array_equal(ranks[0][name], ranks[1][name]), name


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_resumes_bit_identical(uninterrupted, tmp_path):
    runs = tmp_path / "runs"
    done = meshrun([*ARGS, "--max-failures", "1", SCRIPT, "6", "3"], runs_dir=runs, name="killed")
    assert done.code == 0, done.stderr
    resumed = [e for e in done.events() if e["event"] == "resuming"]
    assert [e["step"] for e in resumed] == [3], resumed
    assert not list((done.run_dir / "checkpoints").glob("damaged-*"))
    for got, want in zip(finals(done.run_dir), finals(uninterrupted), strict=True):
        assert sorted(got) == sorted(want)
        for name in want:
            assert got[name].dtype == want[name].dtype and got[name].tobytes() == want[name].tobytes(), name


@pytest.mark.slow
@covers("ckpt-verify-not-restorable", "run-resume-cannot-restore")
def test_a_whole_checkpoint_that_cannot_be_restored_is_named_not_set_aside(uninterrupted, tmp_path):
    # The layout meshrun committed before it kept per-process copies apart:
    # two shards each covering the whole leaf, told from nothing.
    runs = tmp_path / "runs"
    shutil.copytree(uninterrupted.parent, runs)
    run_dir = runs / uninterrupted.name
    for step in sorted(run_dir.glob("checkpoints/step-*")):
        path = step / "manifest.json"
        manifest = json.loads(path.read_text())
        for leaf in manifest["leaves"]:
            for shard in leaf["shards"]:
                shard.pop("rank", None)
        path.write_text(json.dumps(manifest))
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())

    verdict = cli("ckpt", "verify", run_dir / "checkpoints" / "step-6")
    exits("ckpt-verify-not-restorable", verdict)
    assert verdict.stdout.startswith("bytes intact: "), verdict.stdout
    assert "checksum" not in verdict.stderr

    before_files = snapshot(run_dir / "checkpoints")
    again = meshrun([*ARGS, SCRIPT, "8"], runs_dir=runs, name=run_dir.name)
    exits("run-resume-cannot-restore", again)
    assert snapshot(run_dir / "checkpoints") == before_files
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before, "a checkpoint was moved"
    assert not [e for e in again.events() if e["event"] == "worker_started" and e["attempt"] == 2], "the attempt started from step 0"

    fresh = meshrun([*ARGS, "--resume-from", "none", SCRIPT, "2"], runs_dir=runs, name=run_dir.name)
    assert fresh.code == 0, fresh.stderr
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["step-1", "step-2"] + [f"superseded-step-{s}" for s in range(1, 7)], names


@pytest.mark.slow
@covers("restore-per-process-no-copy")
def test_a_rank_that_saved_no_copy_gets_rank_0s_only_when_all_agree(uninterrupted):
    # Restored onto 3 processes: rank 2 saved nothing. The step counter is
    # the same on every process, so rank 2 gets it; each process's vector
    # is its own, so rank 2 has none to get.
    step = uninterrupted / "checkpoints" / "step-6"
    reader = _native.CheckpointReader(str(step), rank=2)
    count = np.empty(4, np.uint8)
    reader.read_many([("count", [], count)])
    assert count.view(np.int32)[0] == 6
    vec = np.empty(16, np.uint8)
    with pytest.raises(CheckpointError) as err:
        reader.read_many([("vec", [(0, 4)], vec)])
    says("restore-per-process-no-copy", str(err.value))
    # Its own rank's copy, for a rank that saved one.
    _native.CheckpointReader(str(step), rank=1).read_many([("vec", [(0, 4)], vec)])
    assert vec.view(np.float32)[0] == 1 + 6 * 0.5
