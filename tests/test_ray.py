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
from conftest import HELLO, MESHRUN, ROOT, SCRIPTS, alive, assert_none_left, cli, meshrun, read_jsonl, start, stop, wait_for
from errors_page import covers, exits

DIGITS = str(ROOT / "examples" / "digits_dp.py")

# The tests on a cluster are marked slow: starting one takes about 10 s, and
# their runs as long again; the checks of arguments need none.


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


@pytest.mark.slow
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


GPT = str(ROOT / "examples" / "gpt.py")
GPT_TINY = ["--batch-size", "8", "--seq-len", "32", "--d-model", "32", "--layers", "2", "--heads", "4", "--eval-every", "100000", "--eval-batches", "1", "--data", "2", "--tensor", "2", "--steps", "16"]


def final_losses(records):
    """Step -> loss of the last attempt that ran the step."""
    out = {}
    for r in sorted(records, key=lambda r: r["attempt"]):
        if "loss" in r["metrics"]:
            out[r["step"]] = r["metrics"]["loss"]
    return out


@pytest.mark.slow
def test_gpt_on_ray_with_a_killed_worker_resumes_to_the_local_result(two_nodes, tmp_path):
    """The sharded GPT (data 2 x tensor 2 over two hosts) on Ray, with one
    worker SIGKILLed mid-run, restarts from its checkpoint and ends with the
    losses and the parameters, bit for bit, of the uninterrupted local run."""
    runs, data = tmp_path / "runs", ["--data-dir", str(tmp_path / "data")]
    launch = ["-n", "2", "--hosts", "2", "--devices-per-proc", "2", "--checkpoint-every", "2", "--tee", "none"]
    local = meshrun([*launch, GPT, *GPT_TINY, *data, "--params-digest", str(tmp_path / "local.sha")], runs_dir=runs, name="local", timeout=400)
    assert local.code == 0, local.stderr + local.log(0)[-2000:]

    run_dir = runs / "ray"
    proc = start(on_ray(two_nodes, "--ray-strategy", "STRICT_SPREAD", "--max-failures", "1", *launch, GPT, *GPT_TINY, *data, "--params-digest", str(tmp_path / "ray.sha")), runs_dir=runs, name="ray")
    try:
        wait_for(lambda: proc.poll() is not None or any((r["step"] or 0) >= 5 for r in read_jsonl(run_dir / "metrics.jsonl")), 180, "the GPT to train on Ray")
        assert proc.poll() is None, proc.communicate()[1]
        pid = next(e["pid"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "worker_started" and e["rank"] == 1)
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=400)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    restarts = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "restarting"]
    assert len(restarts) == 1 and restarts[0]["from_step"] is not None and restarts[0]["from_step"] >= 2
    want, got = final_losses(local.metrics()), final_losses(read_jsonl(run_dir / "metrics.jsonl"))
    assert sorted(got) == list(range(1, 17)) and got.keys() == want.keys()
    assert max(abs(got[s] - want[s]) for s in want) < 1e-5
    assert (tmp_path / "ray.sha").read_text() == (tmp_path / "local.sha").read_text(), "parameters differ from the local run"
    placement = json.loads((run_dir / "ray-placement.json").read_text())
    assert len({h["node_id"] for h in placement["hosts"]}) == 2
    assert_none_left(run_dir)


@pytest.mark.slow
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


@pytest.mark.slow
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



@pytest.mark.slow
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


@covers("run-ray-unreachable")
def test_ray_address_that_does_not_answer(tmp_path):
    t0 = time.monotonic()
    proc = cli("run", "--runs-dir", tmp_path / "runs", "--ray", "127.0.0.1:9", "--control-host", "127.0.0.1", "--platform", "cpu", HELLO)
    exits("run-ray-unreachable", proc)
    assert time.monotonic() - t0 < 30


def psum_fn():
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    import meshrun

    ctx = meshrun.get_context()
    total = multihost_utils.process_allgather(jnp.array([ctx.rank + 1])).sum()
    meshrun.report({"step": 0, "sum": int(total), "host": ctx.host_rank})


@pytest.mark.slow
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


@pytest.fixture
def driver_on(two_nodes):
    """This process joined to the two-node cluster as a driver, as a user
    preparing data with Ray Data would be."""
    import ray

    saved = dict(os.environ)
    ray.init(address=two_nodes, logging_level="ERROR", log_to_driver=False)
    try:
        yield two_nodes
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)


def read_shard_fn(config):
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils

    import meshrun

    ctx = meshrun.get_context()
    ids, types = [], set()
    for batch in meshrun.get_dataset_shard("train").iter_batches(batch_size=config["batch"], batch_format="numpy"):
        types.add(type(batch["x"]).__name__)
        assert np.array_equal(batch["x"], batch["id"] * 2)
        ids.extend(int(i) for i in batch["id"])
    with open(os.path.join(ctx.run_dir, f"ids-{ctx.rank}.json"), "w") as f:
        json.dump({"ids": ids, "types": sorted(types)}, f)
    # The shards feed one jax.distributed program: a sum across processes.
    total = multihost_utils.process_allgather(jnp.array([sum(ids)], dtype=jnp.int32)).sum()
    meshrun.report({"step": 0, "total": int(total)})


@pytest.mark.slow
def test_ray_data_shards_reach_every_worker_once(driver_on, tmp_path):
    import ray

    import meshrun

    rows = 1000
    ds = ray.data.range(rows).map_batches(lambda b: {"id": b["id"], "x": b["id"] * 2})
    result = meshrun.Trainer(
        read_shard_fn,
        train_loop_config={"batch": 64},
        datasets={"train": ds},
        scaling_config=meshrun.ScalingConfig(num_workers=2, num_hosts=2, backend="ray", ray_address=driver_on, ray_strategy="STRICT_SPREAD", control_host="127.0.0.1"),
        run_config=meshrun.RunConfig(name="data", storage_path=str(tmp_path / "runs"), tee="none"),
    ).fit()
    assert result.status == "succeeded", result.error
    run_dir = tmp_path / "runs" / "data"
    parts = [json.loads((run_dir / f"ids-{r}.json").read_text()) for r in (0, 1)]
    assert all(p["types"] == ["ndarray"] for p in parts)
    assert len(parts[0]["ids"]) == len(parts[1]["ids"]) == rows // 2, "equal splits keep SPMD steps in lock step"
    assert sorted(parts[0]["ids"] + parts[1]["ids"]) == list(range(rows)), "every row once"
    assert result.metrics["total"] == sum(range(rows))
    assert_none_left(run_dir)


def test_get_dataset_shard_without_datasets_names_the_fix(monkeypatch):
    import meshrun

    monkeypatch.setenv("MESHRUN_RUN_DIR", "/nonexistent")
    with pytest.raises(meshrun.ConfigError, match=r"this run was given no datasets; pass Trainer\(\.\.\., datasets=\{'train': ray_dataset\}\)"):
        meshrun.get_dataset_shard("train")


def test_datasets_must_be_ray_datasets(tmp_path):
    import meshrun

    with pytest.raises(meshrun.ConfigError, match=r"datasets\['train'\] must be a ray.data.Dataset, got list"):
        meshrun.Trainer(psum_fn, datasets={"train": [1, 2]}, run_config=meshrun.RunConfig(storage_path=str(tmp_path / "runs"))).fit()
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def one_node_with_gpus():
    """A single-node cluster from ``ray.init`` in this process, declaring 4
    GPUs (Ray hands out their ids; no GPU is touched). Its tests come last:
    after a ``ray.init`` of one cluster and ``ray.shutdown`` in a process,
    Ray 2.60 cannot create actors from a later ``ray.init`` to another
    cluster in the same process (every actor dies before it starts)."""
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
