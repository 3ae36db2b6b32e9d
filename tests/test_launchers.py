"""Programs written for other launchers run unmodified: each reads its
launcher's variables (docs/migrating.md), and all of them meet in one run."""

from __future__ import annotations

import json

from conftest import SCRIPTS, meshrun

WARNING = "contradict where meshrun placed this process"


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
