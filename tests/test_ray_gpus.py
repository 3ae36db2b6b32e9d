"""The Ray backend hands each worker exactly the GPUs Ray assigned to its
host's bundle, on a one-node cluster that declares GPUs it does not have.
Apart from test_ray.py because its cluster must be the test process's last
``ray.init`` (see the fixture)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import SCRIPTS, meshrun
from test_ray import on_ray

# `ray.init` in this process forks Ray's helper processes, which exec at
# once. JAX warns at every fork once a backend of its is up in the process
# (another test file may have started one here first, as pytest-xdist
# orders them); nothing of JAX runs in the children.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")


@pytest.fixture
def one_node_with_gpus():
    """A single-node cluster from ``ray.init`` in this process, declaring 4
    GPUs (Ray hands out their ids; no GPU is touched). This file runs after
    test_ray.py (pytest takes files in name order), and no later one calls
    ``ray.init`` in the test process: after a ``ray.init`` of one cluster
    and ``ray.shutdown`` in a process, Ray 2.60 cannot create actors from a
    later ``ray.init`` to another cluster in the same process (every actor
    dies before it starts)."""
    saved = dict(os.environ)  # first: a node started with the variable below set cannot join
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    # "local": a new cluster, even while the module's two-node cluster is up.
    ray.init(address="local", num_cpus=4, num_gpus=4, include_dashboard=False, logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        # ray.init leaves settings in the environment (RAY_AUTH_MODE, ...)
        # that processes started later would inherit.
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.slow
def test_workers_get_the_gpus_ray_assigned_to_their_bundle(one_node_with_gpus, tmp_path):
    """Both hosts packed on one node: host 1's bundle holds GPUs that are
    not 0 and 1, and its workers must get exactly those (Ray's JaxTrainer
    would set 0..k-1 whatever Ray assigned)."""
    done = meshrun(on_ray(one_node_with_gpus, "-n", "4", "--hosts", "2", "--platform", "cuda", "--gpus-per-proc", "1", "--tee", "none", str(SCRIPTS / "dump_env.py")), runs_dir=tmp_path / "runs")
    assert done.code == 0, done.stderr
    envs = [json.loads((done.run_dir / f"env-{r}.json").read_text()) for r in range(4)]
    got = [e["CUDA_VISIBLE_DEVICES"] for e in envs]
    assert sorted(got) == ["0", "1", "2", "3"], got
    by_host = {h: sorted(e["CUDA_VISIBLE_DEVICES"] for e in envs if e["MESHRUN_HOST_RANK"] == str(h)) for h in (0, 1)}
    assert by_host[0] != by_host[1] and sorted(by_host[0] + by_host[1]) == ["0", "1", "2", "3"]
    assert ["0", "1"] in by_host.values() and ["2", "3"] in by_host.values()
