"""The Ray backend against real Ray clusters that the tests start and shut
down themselves: the same program gives the same losses as the local
backend, agents land on distinct nodes, a dead actor or worker restarts the
attempt, an elastic run starts on the hosts Ray can place and grows when
it has room, and a wrong address is a clear error. Every test on the
cluster shares one (raycluster.py): starting one costs 12 CPU-seconds.

The two-node cluster's nodes share nothing: the head runs on this machine,
beside the controller, the other node in a namespace host (see nshosts.py)
with its own address, /tmp (so its own Ray session folder) and scratch
folder. The run folder stays here; checkpoints and what scripts
write for the tests go to the run's storage in the hosts' shared folder."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GPT, GPT_TINY, HELLO, MESHRUN, ROOT, SCRIPTS, alive, assert_none_left, cli, meshrun, read_jsonl, start, stop, wait_for
from errors_page import covers, exits, says
from raycluster import RAY_ENV, TwoNodes, two_node_cluster

DIGITS = str(ROOT / "examples" / "digits_dp.py")
PACED = str(SCRIPTS / "gpt_paced.py")
TINY = GPT_TINY[: GPT_TINY.index("--fsdp")]

# The tests on a cluster are marked slow: starting one takes 15-30 s, and
# their runs as long again; the checks of arguments need none.


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, _session_compile_cache):
    """A Ray head here and a second node in a namespace host, 2 CPUs each
    (raycluster.py), for every test of this file."""
    with two_node_cluster(tmp_path_factory, _session_compile_cache) as nodes:
        yield nodes


@pytest.fixture
def storage(two_nodes, tmp_path) -> Path:
    """This test's run storage (--storage), in the folder both nodes see."""
    path = two_nodes.hosts.shared / tmp_path.name
    path.mkdir()
    return path


def on_ray(nodes: TwoNodes | str, *args: str) -> list[str]:
    """The two-node cluster: the controller listens on the head's address,
    the one both nodes reach. A one-node cluster's address: on loopback."""
    if isinstance(nodes, TwoNodes):
        return ["--ray", nodes.address, "--control-host", nodes.head_ip, *args]
    return ["--ray", nodes, "--control-host", "127.0.0.1", *args]


def placed(run_dir: Path) -> dict[int, dict]:
    """Host rank -> its record in ray-placement.json."""
    return {h["host"]: h for h in json.loads((run_dir / "ray-placement.json").read_text())["hosts"]}


def assert_spread(nodes: TwoNodes, run_dir: Path) -> None:
    """One host on each node, each known by the node's own address."""
    hosts = placed(run_dir).values()
    assert len({h["node_id"] for h in hosts}) == 2, "STRICT_SPREAD put both agents on one node"
    assert sorted(h["ip"] for h in hosts) == sorted([nodes.head_ip, nodes.node_ip])


def losses(records):
    return {r["step"]: r["metrics"]["loss"] for r in records if "loss" in r["metrics"]}


@pytest.mark.slow
def test_digits_gives_the_same_losses_on_ray_as_locally(two_nodes, storage, tmp_path):
    runs = tmp_path / "runs"
    # 50 steps (of the example's 400) keep the suite short; the losses
    # must agree at every one.
    local = meshrun(["-n", "2", "--hosts", "2", "--devices-per-proc", "2", "--tee", "none", DIGITS, "--steps", "50"], runs_dir=runs, name="local")
    assert local.code == 0, local.stderr
    ray = meshrun(on_ray(two_nodes, "-n", "2", "--hosts", "2", "--ray-strategy", "STRICT_SPREAD", "--storage", str(storage), "--devices-per-proc", "2", "--tee", "none", DIGITS, "--steps", "50"), runs_dir=runs, name="ray")
    assert ray.code == 0, ray.stderr
    want, got = losses(local.metrics()), losses(ray.metrics())
    assert len(want) == 50 and got.keys() == want.keys()
    assert max(abs(got[s] - want[s]) for s in want) < 1e-5
    assert_spread(two_nodes, ray.run_dir)


def final_losses(records):
    """Step -> loss of the last attempt that ran the step."""
    out = {}
    for r in sorted(records, key=lambda r: r["attempt"]):
        if "loss" in r["metrics"]:
            out[r["step"]] = r["metrics"]["loss"]
    return out


@pytest.mark.slow
def test_gpt_on_ray_with_a_killed_worker_resumes_to_the_local_result(two_nodes, storage, tmp_path, gpt_reference):
    """The sharded GPT (fsdp 2 x tensor 2 over two hosts) on Ray, with one
    worker SIGKILLed mid-run, restarts from its checkpoint and ends with the
    losses and the parameters, bit for bit, of the uninterrupted local run
    (the suite's shared reference: 2 processes x 2 devices on one host).
    Each node builds the corpus in its own /tmp; rank 0, on either node,
    writes the digest to the storage. Memory checkpoints are replicated to
    the other node; the restart takes them, or storage's (Ray may move hosts)."""
    steps = 30  # those of the restart tests' shared reference
    ref = gpt_reference(*GPT_TINY, "--steps", str(steps))
    runs, data = tmp_path / "runs", ["--data-dir", str(tmp_path / "data")]
    launch = ["-n", "2", "--hosts", "2", "--devices-per-proc", "2", "--checkpoint-every", "2", "--tee", "none"]
    run_dir = runs / "ray"
    digest = storage / "ray.sha"
    proc = start(on_ray(two_nodes, "--ray-strategy", "STRICT_SPREAD", "--storage", str(storage), "--max-failures", "1", "--memory-checkpoint-every", "1", *launch, GPT, *GPT_TINY, "--steps", str(steps), *data, "--params-digest", str(digest)), runs_dir=runs, name="ray")
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
    held = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "memory_checkpoint_committed" and e["attempt"] == 1]
    assert held and all(e["replicated"] for e in held), "memory checkpoints were not replicated between the nodes"
    chose = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] in ("resuming_from_memory", "memory_unavailable")]
    newest_memory = max(e["step"] for e in held)
    if newest_memory >= restarts[0]["from_step"]:
        assert len(chose) == 1 and chose[0]["step"] >= restarts[0]["from_step"], (chose, restarts, [e["step"] for e in held])
        # Whether Ray put each host back where it ran or on its buddy's
        # node, the restart loaded the train step the first attempt compiled
        # (from the host's own folder, or from the replica on that node).
        loaded = sorted((e["rank"], e["outcome"]) for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "executable" and e["attempt"] == 2 and e["name"].endswith(".train_step"))
        assert loaded == [(0, "loaded"), (1, "loaded")], (loaded, chose)
    else:
        # A memory step commits once its replica is on the other node; a
        # durable one can be newer by then, and the newer source wins:
        # memory is not asked.
        assert chose == [], (chose, restarts, [e["step"] for e in held])
    got = final_losses(read_jsonl(run_dir / "metrics.jsonl"))
    assert sorted(got) == list(range(1, steps + 1)) and got.keys() == ref.losses.keys()
    assert max(abs(got[s] - ref.losses[s]) for s in got) < 1e-5
    assert digest.read_text() == ref.digest, "parameters differ from the local run"
    assert any(e["event"] == "checkpoint_committed" for e in read_jsonl(run_dir / "events.jsonl"))
    assert any(p.name.startswith("step-") for p in (storage / "ray" / "checkpoints").iterdir()), "no checkpoint in the storage"
    assert_spread(two_nodes, run_dir)
    assert_none_left(run_dir)


@pytest.mark.slow
def test_env_contract_on_ray(two_nodes, storage, tmp_path):
    """PACK cannot fit two hosts of 2 CPUs on one 2-CPU node: one host per
    node, each worker told its own node's address and the controller's."""
    done = meshrun(on_ray(two_nodes, "-n", "4", "--hosts", "2", "--storage", str(storage), "--platform", "cpu", "--tee", "none", str(SCRIPTS / "dump_env.py")), runs_dir=tmp_path / "runs")
    assert done.code == 0, done.stderr
    envs = [json.loads((storage / "t" / f"env-{r}.json").read_text()) for r in range(4)]
    assert {e["MESHRUN_HOST_RANK"] for e in envs} == {"0", "1"}
    hosts = placed(done.run_dir)
    assert sorted(h["ip"] for h in hosts.values()) == sorted([two_nodes.head_ip, two_nodes.node_ip])
    assert all(e["MESHRUN_HOST_IP"] == hosts[int(e["MESHRUN_HOST_RANK"])]["ip"] for e in envs)
    assert all(e["MESHRUN_CONTROL_ADDR"].startswith(f"{two_nodes.head_ip}:") for e in envs)
    assert {e["MESHRUN_COORDINATOR"].rsplit(":", 1)[0] for e in envs} == {hosts[0]["ip"]}
    assert len({e["MESHRUN_COORDINATOR"] for e in envs}) == 1
    assert all(e["CUDA_VISIBLE_DEVICES"] == "" for e in envs if "CUDA_VISIBLE_DEVICES" in e)
    record = json.loads((done.run_dir / "run.json").read_text())
    assert record["plan"]["ray"] == {"address": two_nodes.address, "strategy": "PACK"}
    assert_none_left(done.run_dir)


@pytest.mark.slow
def test_a_killed_agent_actor_restarts_the_attempt(two_nodes, storage, tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "actor"
    proc = start(on_ray(two_nodes, "-n", "2", "--hosts", "2", "--storage", str(storage), "--max-failures", "1", "--platform", "cpu", "--tee", "none", str(SCRIPTS / "plain_sleeper.py")), runs_dir=runs, name="actor")
    try:
        wait_for(lambda: proc.poll() is not None or all((storage / "actor" / f"ready-{r}").exists() for r in (0, 1)), 90, "workers on Ray")
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
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    import meshrun

    ctx = meshrun.get_context()
    total = multihost_utils.process_allgather(jnp.array([ctx.rank + 1])).sum()
    meshrun.report({"step": 0, "sum": int(total), "host": ctx.host_rank})


@pytest.mark.slow
def test_trainer_on_ray(two_nodes, storage):
    """The Trainer's storage_path holds the run folders and the checkpoints
    alike, so it is the folder both nodes see."""
    import meshrun

    result = meshrun.Trainer(
        psum_fn,
        scaling_config=meshrun.ScalingConfig(num_workers=2, num_hosts=2, backend="ray", ray_address=two_nodes.address, ray_strategy="STRICT_SPREAD", control_host=two_nodes.head_ip),
        run_config=meshrun.RunConfig(name="fit", storage_path=str(storage), tee="none"),
    ).fit()
    assert result.status == "succeeded", result.error
    assert result.metrics["sum"] == 3
    assert_spread(two_nodes, storage / "fit")
    assert_none_left(storage / "fit")


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
    ray.init(address=two_nodes.address, logging_level="ERROR", log_to_driver=False)
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
    # The storage: the folder every host reaches (the run folder is the
    # controller's only).
    with open(os.path.join(ctx.storage_dir, f"ids-{ctx.rank}.json"), "w") as f:
        json.dump({"ids": ids, "types": sorted(types)}, f)
    # The shards feed one jax.distributed program: a sum across processes.
    total = multihost_utils.process_allgather(jnp.array([sum(ids)], dtype=jnp.int32)).sum()
    meshrun.report({"step": 0, "total": int(total)})


@pytest.mark.slow
def test_ray_data_shards_reach_every_worker_once(driver_on, storage):
    import ray

    import meshrun

    rows = 1000
    ds = ray.data.range(rows).map_batches(lambda b: {"id": b["id"], "x": b["id"] * 2})
    result = meshrun.Trainer(
        read_shard_fn,
        train_loop_config={"batch": 64},
        datasets={"train": ds},
        scaling_config=meshrun.ScalingConfig(num_workers=2, num_hosts=2, backend="ray", ray_address=driver_on.address, ray_strategy="STRICT_SPREAD", control_host=driver_on.head_ip),
        run_config=meshrun.RunConfig(name="data", storage_path=str(storage), tee="none"),
    ).fit()
    assert result.status == "succeeded", result.error
    run_dir = storage / "data"
    assert_spread(driver_on, run_dir)
    parts = [json.loads((run_dir / f"ids-{r}.json").read_text()) for r in (0, 1)]
    assert all(p["types"] == ["ndarray"] for p in parts)
    assert len(parts[0]["ids"]) == len(parts[1]["ids"]) == rows // 2, "equal splits keep SPMD steps in lock step"
    assert sorted(parts[0]["ids"] + parts[1]["ids"]) == list(range(rows)), "every row once"
    assert result.metrics["total"] == sum(range(rows))
    assert_none_left(run_dir)


def wait_for_rows_fn():
    import meshrun

    for _ in meshrun.get_dataset_shard("train").iter_batches(batch_size=8):
        meshrun.report({"step": 0})


@pytest.mark.slow
@covers("run-ray-data-starved")
def test_ray_data_that_cannot_get_a_cpu_shows_and_ends_at_the_start_timeout(driver_on, storage, capfd):
    """The workers' bundles take every CPU of the cluster, so the Ray Data
    tasks feeding them can never run: the progress line says so, with what
    the cluster has free, and the start timeout ends the attempt."""
    import ray

    import meshrun

    t0 = time.monotonic()
    with pytest.raises(meshrun.TrainingFailedError) as info:
        meshrun.Trainer(
            wait_for_rows_fn,
            datasets={"train": ray.data.range(100).map_batches(lambda b: {"id": b["id"]})},
            scaling_config=meshrun.ScalingConfig(num_workers=2, num_hosts=2, backend="ray", ray_address=driver_on.address, ray_strategy="STRICT_SPREAD", control_host=driver_on.head_ip, resources_per_worker={"CPU": 2}),
            run_config=meshrun.RunConfig(name="starved", storage_path=str(storage), tee="none", failure_config=meshrun.FailureConfig(start_timeout_s=20)),
        ).fit()
    waited = time.monotonic() - t0
    err = capfd.readouterr().err
    # Ray Data asks for as many read tasks as it thinks it has CPUs.
    assert re.search(r"starting \(\d+s\) · waiting for Ray: \d+ Ray tasks? or actors? of \{'CPU': 1.0\} \(free: CPU 0 of 4\)", err), err[-3000:]
    says("run-ray-data-starved", str(info.value))
    events = read_jsonl(storage / "starved" / "events.jsonl")
    assert any(e["event"] == "waiting_for_resources" and e["what"] for e in events)
    # The attempt ends at the start timeout (20 s after it started), or, for
    # a wait first seen later (its workers slow to start on a busy
    # machine), 30 s after the wait began.
    started = next(e["time"] for e in events if e["event"] == "attempt_started")
    since = None
    for e in events:
        if e["event"] == "waiting_for_resources":
            since = (since or e["time"]) if e["what"] else None
    assert since is not None, events
    wait_began = since - started
    secs = int(re.search(r"reported no step in (\d+) s", str(info.value)).group(1))
    assert abs(secs - (20 if wait_began < 20 else wait_began + 30)) <= 2, (secs, wait_began, str(info.value))
    assert waited < secs + 60, f"the attempt ended {waited:.0f} s after fit() began"
    assert_none_left(storage / "starved")


@pytest.mark.slow
@covers("run-ray-start-timeout")
def test_a_placement_group_that_waits_shows_and_ends_at_the_start_timeout(driver_on, tmp_path):
    """An actor of this driver holds one node's CPUs: STRICT_SPREAD can
    place nothing until it goes, and the run says so, then gives up."""
    import ray

    @ray.remote(num_cpus=2)
    class Hold:
        def node(self) -> str:
            return ray.util.get_node_ip_address()

    hold = Hold.remote()
    try:
        ray.get(hold.node.remote(), timeout=60)
        t0 = time.monotonic()
        proc = subprocess.run(
            [str(MESHRUN), "run", "--runs-dir", str(tmp_path / "runs"), *on_ray(driver_on, "-n", "2", "--hosts", "2", "--ray-strategy", "STRICT_SPREAD", "--start-timeout", "10"), "--platform", "cpu", str(SCRIPTS / "hello.py")],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
    finally:
        ray.kill(hold)
    exits("run-ray-start-timeout", proc)
    assert "waiting for Ray: a placement group of 2 x {'CPU': 1.0} (STRICT_SPREAD) (free: CPU 2 of 4)" in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 60


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


# ---------------------------------------------------------------- elastic

# Another job on the cluster: holds `CPU` bundles until its stdin closes.
HOG = """
import sys, ray
from ray.util.placement_group import placement_group, remove_placement_group
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False, configure_logging=False)
pg = placement_group([{"CPU": 1}] * int(sys.argv[2]), strategy="PACK")
ray.get(pg.ready(), timeout=120)
print("held", flush=True)
sys.stdin.read()
remove_placement_group(pg)
ray.shutdown()
"""


@pytest.mark.slow
def test_on_ray_an_elastic_run_starts_with_what_fits_and_grows_when_ray_has_room(two_nodes, tmp_path):
    """4 CPUs in the cluster, 3 held by another job: `--hosts 1:2` (a host
    is a bundle of 1 CPU) starts on the one host Ray can place, after the
    rejoin timeout. When the other job lets go, the second host's bundle is
    placed, its agent waits, and the run grows to 2 hosts at its next
    report and ends there."""
    hog = subprocess.Popen([sys.executable, "-c", HOG, two_nodes.address, "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **RAY_ENV}, cwd=ROOT)
    storage = two_nodes.hosts.shared / tmp_path.name
    storage.mkdir()
    runs = tmp_path / "runs"
    run_dir = runs / "grow"
    events = lambda kind: [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]  # noqa: E731
    proc = None
    try:
        assert hog.stdout.readline().strip() == "held", hog.stderr.read()
        launch = ["-n", "2", "--hosts", "1:2", "--devices-per-proc", "2", "--platform", "cpu", "--checkpoint-every", "2", "--rejoin-timeout", "3", "--storage", str(storage), "--tee", "none"]
        train = [PACED, *TINY, "--fsdp", "2", "--steps", "40", "--data-dir", str(tmp_path / "data")]
        proc = start(on_ray(two_nodes, *launch, *train), runs_dir=runs, name="grow", env={"GPT_PACE_S": "0.3"})
        wait_for(lambda: proc.poll() is not None or events("checkpoint_committed"), 240, "a commit on the one host Ray placed")
        assert proc.poll() is None, proc.communicate()[1]
        assert [(e["hosts"], e["previous_hosts"]) for e in events("resized")] == [(1, None)]
        hog.communicate(timeout=60)  # its stdin closes: it lets go
        _, err = proc.communicate(timeout=400)
    finally:
        if proc is not None:
            stop(proc)
        if hog.poll() is None:
            hog.kill()
        hog.communicate()
    assert proc.returncode == 0, err
    assert [(e["attempt"], e["hosts"]) for e in events("resized")] == [(1, 1), (2, 2)]
    assert [(e["from_hosts"], e["to_hosts"]) for e in events("growing")] == [(1, 2)]
    ended = {e["attempt"]: e["state"] for e in events("attempt_ended")}
    assert ended == {1: "resized", 2: "succeeded"}, ended
    assert not events("worker_failed")
    steps = {r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["attempt"] == 2 and "loss" in r["metrics"]}
    assert max(steps) == 40
    assert_none_left(run_dir)
