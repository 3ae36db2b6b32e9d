"""The sharded GPT computes the same thing on every layout of processes,
hosts and mesh axes, and the mesh keeps busy axes within a host."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import GPT_TINY, ROOT, SCRIPTS, meshrun
from hostsrun import meshrun_on

# Each test trains the GPT example: minutes on two cores.
pytestmark = pytest.mark.slow

EXAMPLE = str(ROOT / "examples" / "gpt.py")
# The restart tests' tiny GPT (conftest's GPT_TINY) without its mesh, for
# 20 steps.
SMALL = ["--steps", "20", *GPT_TINY[: GPT_TINY.index("--fsdp")]]
LAYOUTS = {
    "1x4_fsdp4": (["-n", "1", "--devices-per-proc", "4"], ["--data", "1", "--fsdp", "4"]),
    "4x1_data2_fsdp2": (["-n", "4", "--devices-per-proc", "1"], ["--data", "2", "--fsdp", "2"]),
}


@pytest.fixture(scope="module")
def gpt_runs(tmp_path_factory, gpt_data, gpt_reference):
    """Step -> loss of the first 20 steps on each layout. The 2 x 2 layout
    (fsdp 2 x tensor 2) is the suite's shared reference run (30 steps; no
    step depends on how many follow)."""
    base = tmp_path_factory.mktemp("gpt")
    out = {}
    for name, (launch, mesh) in LAYOUTS.items():
        done = meshrun([*launch, "--tee", "none", EXAMPLE, *SMALL, *mesh, "--data-dir", gpt_data], runs_dir=base / "runs", name=name, timeout=400)
        assert done.code == 0, done.stderr + done.log(0)[-3000:]
        out[name] = {r["step"]: r["metrics"]["loss"] for r in done.metrics() if "loss" in r["metrics"]}
    reference = gpt_reference(*GPT_TINY, "--steps", "30").losses
    out["2x2_fsdp2_tensor2"] = {step: loss for step, loss in reference.items() if step <= 20}
    return out


def test_per_step_losses_agree_across_layouts(gpt_runs):
    reference = gpt_runs["1x4_fsdp4"]
    assert sorted(reference) == list(range(1, 21))
    for name, losses in gpt_runs.items():
        worst = max(abs(losses[s] - reference[s]) for s in reference)
        assert worst < 1e-4, f"{name}: max abs loss difference {worst:g}"
    assert reference[20] < reference[1]


def test_two_hosts_that_share_nothing_agree(gpt_runs, nshosts, gpt_data):
    """2 namespace hosts x 1 process x 2 devices, data 2 x tensor 2; the
    data set in the storage both see."""
    hosts = nshosts(2)
    shutil.copytree(gpt_data, hosts.shared / "data")
    done = meshrun_on(hosts, ["-n", "2", "--devices-per-proc", "2", "--tee", "none", EXAMPLE, *SMALL, "--data", "2", "--tensor", "2", "--data-dir", str(hosts.shared / "data")], timeout=400)
    assert done.code == 0, done.stderr + done.log(0)[-3000:]
    losses = {r["step"]: r["metrics"]["loss"] for r in done.metrics() if "loss" in r["metrics"]}
    reference = gpt_runs["1x4_fsdp4"]
    worst = max(abs(losses[s] - reference[s]) for s in reference)
    assert worst < 1e-4, f"max abs loss difference {worst:g}"


def test_mesh_puts_tensor_then_fsdp_within_a_host(nshosts):
    hosts = nshosts(2)
    # 2 hosts x 2 processes x 1 device: (data=2, fsdp=2) keeps each fsdp group on one host
    done = meshrun_on(hosts, ["-n", "4", str(SCRIPTS / "mesh_layout.py"), "2", "2", "1"], name="m1")
    assert done.code == 0, done.stderr
    layout = json.loads((done.storage_dir / "layout.json").read_text())["hosts"]
    for d, plane in enumerate(layout):
        assert {h for row in plane for h in row} == {d}, layout
    # 2 hosts x 1 process x 2 devices: (fsdp=2, tensor=2) keeps each tensor group in one process
    done = meshrun_on(hosts, ["-n", "2", "--devices-per-proc", "2", str(SCRIPTS / "mesh_layout.py"), "1", "2", "2"], name="m2")
    assert done.code == 0, done.stderr
    procs = json.loads((done.storage_dir / "layout.json").read_text())["processes"]
    assert procs == [[[0, 0], [1, 1]]]


def test_checkpoint_resume_equals_the_uninterrupted_run(gpt_runs, tmp_path, gpt_data):
    """10 steps, then the same run name for 20: the second resumes from
    step 10 and its losses equal those of the uninterrupted 2x2 layout run
    (the same processes, devices and mesh), exactly."""
    base = [*GPT_TINY, "--data-dir", gpt_data]
    launch = ["-n", "2", "--devices-per-proc", "2", "--tee", "none", "--checkpoint-every", "10"]
    runs = tmp_path / "runs"
    first = meshrun([*launch, EXAMPLE, "--steps", "10", *base], runs_dir=runs, name="resumed", timeout=400)
    assert first.code == 0, first.stderr
    second = meshrun([*launch, EXAMPLE, "--steps", "20", *base], runs_dir=runs, name="resumed", timeout=400)
    assert second.code == 0, second.stderr
    assert "gpt: resumed from step 10" in second.log(0)

    def losses(done, attempt):
        return {r["step"]: r["metrics"]["loss"] for r in done.metrics() if "loss" in r["metrics"] and r["attempt"] == attempt}

    whole, resumed = gpt_runs["2x2_fsdp2_tensor2"], losses(second, 2)
    assert sorted(resumed) == list(range(11, 21))
    assert all(resumed[s] == whole[s] for s in resumed), "resumed losses differ from the uninterrupted run"
    assert [e["step"] for e in second.events() if e["event"] == "checkpoint_committed"] == [10, 20]
