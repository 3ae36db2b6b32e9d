"""Checkpoints with this venv's JAX: saved by 2 processes x 2 devices
(fsdp 2 x tensor 2), restored onto other layouts, every shard bitwise."""

from __future__ import annotations

import pytest
from cellrun import PROGRAMS

RESHARD = PROGRAMS / "reshard.py"


@pytest.fixture(scope="module")
def saved(module_meshrun):
    done = module_meshrun(["-n", "2", "--devices-per-proc", "2", RESHARD, "save", "2", "2"], name="ck")
    assert done.code == 0, done.why()
    return module_meshrun, done


def test_save_commits_every_ranks_shards(saved):
    _, done = saved
    assert [e["step"] for e in done.events("checkpoint_committed")] == [5]
    step = done.run_dir / "checkpoints" / "step-5"
    assert sorted(p.name for p in step.iterdir()) == ["manifest.json", "rank-0.safetensors", "rank-1.safetensors"]


@pytest.mark.parametrize(
    "launch, mesh, shards",
    [
        (["-n", "1", "--devices-per-proc", "2"], ["2", "1"], 2 + 2 + 2),  # fewer processes
        (["-n", "2", "--devices-per-proc", "1"], ["2", "1"], 1 + 1 + 1),  # fewer devices per process
    ],
    ids=["1x2", "2x1"],
)
def test_restore_onto_another_layout(saved, launch, mesh, shards):
    run, _ = saved
    done = run([*launch, RESHARD, "restore", *mesh], name="ck")
    assert done.code == 0, done.why()
    ranks = int(launch[1])
    for rank in range(ranks):
        rec = done.json(f"restored-{rank}.json")
        assert rec == {"step": 5, "shards": shards, "devices": 2, "processes": ranks}
