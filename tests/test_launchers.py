"""Programs written for other launchers run unmodified: each reads its
launcher's variables (docs/migrating.md), and all of them meet in one run."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from conftest import MESHRUN, SCRIPTS, meshrun

WARNING = "contradict where meshrun placed this process"


@pytest.mark.slow
def test_programs_of_every_launcher_join_one_run(runs):
    # Rank r joins the way programs of launcher r do: plain JAX, Kubeflow's
    # JAXJob, MaxText's CPU path (a bare host name and port 1234), MaxText's
    # GPU path, torchrun's habits, and a launch shim that rewrites
    # JAX_COORDINATOR_ADDRESS before a plain initialize().
    done = meshrun(["-n", "6", "-q", str(SCRIPTS / "launcher_styles.py")], runs_dir=runs, timeout=120)
    assert done.code == 0, done.stderr
    styles = ["jax", "kubeflow", "maxtext_cpu", "maxtext_gpu", "torchrun", "shim"]
    for rank, style in enumerate(styles):
        rec = json.loads((done.run_dir / f"style-{rank}.json").read_text())
        assert rec == {"style": style, "process_index": rank, "process_count": 6, "gathered": list(range(6))}
        assert f"{style} joined as {rank} of 6" in done.log(rank)
    # MaxText's fixed port on the run's own host is replaced without a word;
    # only the shim, which named another host, is told.
    for rank in range(5):
        assert WARNING not in done.log(rank), done.log(rank)
    assert "coordinator_address (from JAX_COORDINATOR_ADDRESS) 'localhost' -> '127.0.0.1:" in done.log(5), done.log(5)


@pytest.mark.slow
def test_a_metrics_file_the_program_writes_becomes_its_steps(runs, tmp_path):
    # A line left by an earlier run is not this run's and is skipped.
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(json.dumps({"step": 99, "learning/loss": 0.0}) + "\n")
    done = meshrun(["-n", "2", "-q", "--metrics-file", str(metrics), str(SCRIPTS / "metrics_file_writer.py"), str(metrics), "5"], runs_dir=runs, timeout=60)
    assert done.code == 0, done.stderr
    records = [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]
    # Both ranks append a line a step: each step is reported once.
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["metrics"]["learning/loss"] for r in records] == [10.0, 9.0, 8.0, 7.0, 6.0]
    assert all(r["metrics"] == {"learning/loss": r["metrics"]["learning/loss"], "learning/z_loss": 0.0} for r in records)
    # The line that is not JSON is named once, and skipped.
    assert done.log(0).count("--metrics-file") == 1 and "'not json'" in done.log(0), done.log(0)
    # The loss shown is learning/loss, not the first name ending in loss.
    listed = subprocess.run([str(MESHRUN), "ls", "--runs-dir", str(runs)], capture_output=True, text=True, timeout=30)
    assert "6.0000" in listed.stdout, listed.stdout
    status = subprocess.run([str(MESHRUN), "status", "--runs-dir", str(runs), "t"], capture_output=True, text=True, timeout=30)
    assert re.search(r"^step\s+4$", status.stdout, re.M) and "learning/loss=6.0000" in status.stdout, status.stdout


@pytest.mark.slow
def test_jax_is_wired_when_the_program_imports_it_and_not_before(runs):
    # The program's own code starts without JAX or numpy imported (a
    # program that never imports them does not pay their import); imported
    # late, JAX still finds meshrun's side wired (its ClusterEnv, the timed
    # initialize) and the program joins the run.
    done = meshrun(["-n", "2", "-q", str(SCRIPTS / "jax_late.py")], runs_dir=runs, name="late", timeout=120)
    assert done.code == 0, done.stderr
    for rank in range(2):
        rec = json.loads((done.run_dir / f"late-{rank}.json").read_text())
        assert rec == {"jax_before": False, "numpy_before": False, "wired": True, "process_count": 2}, rec
