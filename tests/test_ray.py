"""The Ray backend against real Ray clusters that the tests start and shut
down themselves, every node on loopback: the same program gives the same
losses as the local backend, agents land on distinct nodes, a dead actor
or worker restarts the attempt, and a wrong address is a clear error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from conftest import MESHRUN, ROOT, SCRIPTS, alive, assert_none_left, meshrun, read_jsonl, start, stop, wait_for

DIGITS = str(ROOT / "examples" / "digits_dp.py")


@pytest.fixture(scope="module")
def two_nodes():
    """A head and one more node, 2 CPUs each, on 127.0.0.1."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def on_ray(address: str, *args: str) -> list[str]:
    return ["--ray", address, "--control-host", "127.0.0.1", *args]


def losses(records):
    return {r["step"]: r["metrics"]["loss"] for r in records if "loss" in r["metrics"]}


def test_digits_gives_the_same_losses_on_ray_as_locally(two_nodes, tmp_path):
    runs = tmp_path / "runs"
    local = meshrun(["-n", "2", "--hosts", "2", "--devices-per-proc", "2", "--tee", "none", DIGITS], runs_dir=runs, name="local")
    assert local.code == 0, local.stderr
    ray = meshrun(on_ray(two_nodes, "-n", "2", "--hosts", "2", "--ray-strategy", "STRICT_SPREAD", "--devices-per-proc", "2", "--tee", "none", DIGITS), runs_dir=runs, name="ray")
    assert ray.code == 0, ray.stderr
    want, got = losses(local.metrics()), losses(ray.metrics())
    assert len(want) == 400 and got.keys() == want.keys()
    assert max(abs(got[s] - want[s]) for s in want) < 1e-5
    placement = json.loads((ray.run_dir / "ray-placement.json").read_text())
    assert len({h["node_id"] for h in placement["hosts"]}) == 2, "STRICT_SPREAD put both agents on one node"
    assert all(h["ip"] == "127.0.0.1" for h in placement["hosts"])


def test_env_contract_on_ray(two_nodes, tmp_path):
    done = meshrun(on_ray(two_nodes, "-n", "4", "--hosts", "2", "--platform", "cpu", "--tee", "none", str(SCRIPTS / "dump_env.py")), runs_dir=tmp_path / "runs")
    assert done.code == 0, done.stderr
    envs = [json.loads((done.run_dir / f"env-{r}.json").read_text()) for r in range(4)]
    assert {e["MESHRUN_HOST_RANK"] for e in envs} == {"0", "1"}
    assert all(e["MESHRUN_HOST_IP"] == "127.0.0.1" for e in envs)
    assert all(e["MESHRUN_CONTROL_ADDR"].startswith("127.0.0.1:") for e in envs)
    assert len({e["JAX_COORDINATOR_ADDRESS"] for e in envs}) == 1
    assert all(e["CUDA_VISIBLE_DEVICES"] == "" for e in envs if "CUDA_VISIBLE_DEVICES" in e)
    record = json.loads((done.run_dir / "run.json").read_text())
    assert record["plan"]["ray"] == {"address": two_nodes, "strategy": "PACK"}
    assert_none_left(done.run_dir)


def test_a_killed_agent_actor_restarts_the_attempt(two_nodes, tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "actor"
    proc = start(on_ray(two_nodes, "-n", "2", "--hosts", "2", "--max-failures", "1", "--platform", "cpu", "--tee", "none", str(SCRIPTS / "plain_sleeper.py")), runs_dir=runs, name="actor")
    try:
        wait_for(lambda: proc.poll() is not None or all((run_dir / f"ready-{r}").exists() for r in (0, 1)), 90, "workers on Ray")
        assert proc.poll() is None, proc.communicate()[1]
        first = json.loads((run_dir / "ray-placement.json").read_text())
        os.kill(first["hosts"][1]["actor_pid"], signal.SIGKILL)
        started = lambda: [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "worker_started"]  # noqa: E731
        wait_for(lambda: proc.poll() is not None or len(started()) == 4, 90, "the restart on Ray")
        failed = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "worker_failed"]
        assert failed and failed[0]["attempt"] == 1
        old = [e["pid"] for e in started() if e["attempt"] == 1]
        wait_for(lambda: not any(alive(p) for p in old), 10, "attempt 1's workers to be gone")
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 130
    assert_none_left(run_dir)


def test_an_unreachable_ray_address_is_a_clear_error(tmp_path):
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(MESHRUN), "run", "--runs-dir", str(tmp_path / "runs"), "--ray", "127.0.0.1:9", "--control-host", "127.0.0.1", "--platform", "cpu", str(SCRIPTS / "hello.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert time.monotonic() - t0 < 30
    assert proc.returncode != 0
    assert "cannot reach the Ray cluster at 127.0.0.1:9" in proc.stderr, proc.stderr


def test_a_request_the_cluster_cannot_hold_is_a_clear_error(two_nodes, tmp_path):
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(MESHRUN), "run", "--runs-dir", str(tmp_path / "runs"), *on_ray(two_nodes, "-n", "8", "--hosts", "2"), "--platform", "cpu", str(SCRIPTS / "hello.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1
    assert "could not place the run on Ray: no way to place 2 host(s) of {'CPU': 4.0} each (PACK)" in proc.stderr, proc.stderr
    assert "its nodes have [{'CPU': 2.0}, {'CPU': 2.0}]" in proc.stderr


@pytest.fixture
def one_node_with_gpus():
    """A single-node cluster from ``ray.init`` in this process, declaring 4
    GPUs (Ray hands out their ids; no GPU is touched)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    saved = dict(os.environ)
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


def psum_fn():
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    import meshrun

    ctx = meshrun.get_context()
    total = multihost_utils.process_allgather(jnp.array([ctx.rank + 1])).sum()
    meshrun.report({"step": 0, "sum": int(total), "host": ctx.host_rank})


def test_trainer_on_ray(two_nodes, tmp_path):
    import meshrun

    result = meshrun.Trainer(
        psum_fn,
        scaling_config=meshrun.ScalingConfig(num_workers=2, num_hosts=2, backend="ray", ray_address=two_nodes, ray_strategy="STRICT_SPREAD", control_host="127.0.0.1"),
        run_config=meshrun.RunConfig(name="fit", storage_path=str(tmp_path / "runs"), tee="none"),
    ).fit()
    assert result.status == "succeeded", result.error
    assert result.metrics["sum"] == 3
    placement = json.loads((tmp_path / "runs" / "fit" / "ray-placement.json").read_text())
    assert len({h["node_id"] for h in placement["hosts"]}) == 2
    assert_none_left(tmp_path / "runs" / "fit")


def test_ray_backend_without_an_address_is_a_config_error(tmp_path):
    import meshrun

    with pytest.raises(meshrun.ConfigError, match="needs ray_address"):
        meshrun.Trainer(psum_fn, scaling_config=meshrun.ScalingConfig(backend="ray"), run_config=meshrun.RunConfig(storage_path=str(tmp_path / "runs"))).fit()
    assert not (tmp_path / "runs").exists()
