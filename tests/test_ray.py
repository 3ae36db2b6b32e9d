"""The Ray backend against real Ray clusters that the tests start and shut
down themselves: the same program gives the same losses as the local
backend, agents land on distinct nodes, a dead actor or worker restarts the
attempt, and a wrong address is a clear error.

The two-node cluster's nodes share nothing: the head runs on this machine,
beside the controller, the other node in a namespace host (see nshosts.py)
with its own address, /tmp (so its own Ray session folder) and scratch
folder. The run folder stays here; checkpoints and what scripts
write for the tests go to the run's storage in the hosts' shared folder."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import GPT, GPT_TINY, HELLO, MESHRUN, ROOT, SCRIPTS, alive, assert_none_left, cli, meshrun, read_jsonl, start, stop, wait_for
from errors_page import covers, exits, says
from nshosts import NsHosts, nshosts_unavailable
from ports import free_port

DIGITS = str(ROOT / "examples" / "digits_dp.py")
RAY = Path(sys.executable).parent / "ray"
PR_SET_PDEATHSIG = 1

# The tests on a cluster are marked slow: starting one takes 15-30 s, and
# their runs as long again; the checks of arguments need none.

# Every process of the test cluster carries this variable (with the
# cluster's id), so teardown finds the ones that left the session of the
# `ray start` that made them.
MARK = "MESHRUN_TEST_RAY_CLUSTER"
# A node's own processes start slowly on a busy machine.
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
# The node settings of both `ray start`s. Token authentication off: Ray
# turns it on when it finds a token in the home folder, which drivers that
# were not given it (the controller's placement process, the workers' Ray
# Data clients) could not present. No draining on SIGTERM: the node goes
# at once.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_USAGE_STATS_ENABLED": "0"}
NODE_ARGS = ["--num-cpus", "2", "--block", "--disable-usage-stats", "--include-log-monitor", "false"]

# Run in a process of its own: a driver's ray.init in the test process
# would keep later clusters in this process from starting actors.
NODES_UP = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False, configure_logging=False)
deadline = time.monotonic() + float(sys.argv[2])
while True:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) >= 2 or time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(json.dumps({n["NodeManagerAddress"]: n["Resources"].get("CPU") for n in nodes}))
"""


@dataclass
class TwoNodes:
    #: The head's GCS address, HOST:PORT.
    address: str
    #: The head's address (this machine's on the hosts' bridge), where the
    #: controller listens too.
    head_ip: str
    #: The other node's address (namespace host 0).
    node_ip: str
    hosts: NsHosts


# Runs argv with SIGTERM (which stops a `ray start --block` and its node)
# as its parent-death signal, so the nodes go even if the test process is
# SIGKILLed. It survives exec; nsenter, unshare and sh exec in turn, so in
# a host too the parent is the test process.
WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(%d, signal.SIGTERM, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    sys.exit("the test process is gone")
os.execv(sys.argv[2], sys.argv[2:])
""" % PR_SET_PDEATHSIG


def with_parent(argv: list[str]) -> list[str]:
    return [sys.executable, "-c", WITH_PARENT, str(os.getpid()), *argv]


def tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def marked_pids(mark: str, sessions: set[int]) -> list[int]:
    """Processes of the test cluster: in a session of its `ray start`s, or
    carrying its mark. Zombies are not counted."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            sid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3])
            environ = (entry / "environ").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if (sid in sessions or mark.encode() in environ.split(b"\0")) and alive(pid):
            found.append(pid)
    return found


def stop_nodes(procs: list[subprocess.Popen], mark: str) -> None:
    """SIGTERM to each `ray start --block`'s group (it stops its node's
    processes), SIGKILL to what is left of the groups after STOP_TIMEOUT_S,
    then to any process of the cluster still alive, by pid."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
    sessions = {p.pid for p in procs}
    deadline = time.monotonic() + 5
    while (left := marked_pids(mark, sessions)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not marked_pids(mark, sessions), 10, f"the test cluster's processes {left} to end")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, _session_compile_cache):
    """A Ray head here and a second node in a namespace host, 2 CPUs each:
    two `ray start --block` processes, each leading its own session. Their
    workers share the test session's compilation cache (see conftest's
    ``_own_scratch``)."""
    reason = nshosts_unavailable()
    if reason is not None:
        pytest.skip(f"no network namespaces: {reason}")
    cluster_id = secrets.token_hex(4)
    env = {**RAY_ENV, MARK: cluster_id, "JAX_COMPILATION_CACHE_DIR": str(_session_compile_cache)}
    # The head node's agents keep their scratch here.
    scratch = tmp_path_factory.mktemp("head-scratch")
    hosts = NsHosts(1, compile_cache=_session_compile_cache)
    procs: list[subprocess.Popen] = []
    temp = None
    try:
        # Unix socket paths in the session folder must stay under 108 bytes.
        temp = Path(tempfile.mkdtemp(prefix="mr-ray-", dir="/tmp"))
        head_ip, node_ip = hosts.controller_addr, hosts.addr(0)
        port = free_port(head_ip)
        address = f"{head_ip}:{port}"
        head_log, node_log = temp / "head.out", temp / "node.out"
        with head_log.open("w") as out:
            # Fixed default ports (client server, dashboard, its agent) are
            # replaced by free ones: another Ray on this machine may hold them.
            head = [
                str(RAY), "start", "--head", "--node-ip-address", head_ip, "--port", str(port), "--temp-dir", str(temp),
                "--include-dashboard", "false", "--dashboard-port", str(free_port("127.0.0.1")),
                "--ray-client-server-port", str(free_port(head_ip)), "--dashboard-agent-listen-port", str(free_port(head_ip)), *NODE_ARGS,
            ]  # fmt: skip
            procs.append(subprocess.Popen(with_parent(head), env={**os.environ, **env, "MESHRUN_SCRATCH": str(scratch)}, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

        def gcs_answers() -> bool:
            assert procs[0].poll() is None, f"the Ray head exited with {procs[0].returncode}:\n{tail(head_log)}"
            try:
                socket.create_connection((head_ip, port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_for(gcs_answers, START_TIMEOUT_S, f"the Ray head at {address}")
        with node_log.open("w") as out:
            procs.append(hosts.popen(0, with_parent([str(RAY), "start", "--address", address, "--node-ip-address", node_ip, *NODE_ARGS]), env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))
        up = subprocess.run([sys.executable, "-c", NODES_UP, address, str(START_TIMEOUT_S)], capture_output=True, text=True, timeout=START_TIMEOUT_S + 60, env={**os.environ, **RAY_ENV}, cwd=ROOT)
        nodes = json.loads(up.stdout.strip().splitlines()[-1]) if up.returncode == 0 and up.stdout.strip() else None
        assert nodes == {head_ip: 2.0, node_ip: 2.0}, f"cluster: {nodes}\n{up.stderr[-2000:]}\nhead:\n{tail(head_log)}\nnode:\n{tail(node_log)}"
        yield TwoNodes(address, head_ip, node_ip, hosts)
    finally:
        try:
            stop_nodes(procs, f"{MARK}={cluster_id}")
        finally:
            hosts.close()
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)


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
    import jax
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
