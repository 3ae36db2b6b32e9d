"""Elastic runs (``--hosts MIN:MAX``, ``ScalingConfig(num_workers=(MIN, MAX))``):
a host lost for good, the run going on with fewer, growing back when the
host returns, with the data order and the math of a fixed-size run; too few
hosts left; and what the program is told. Hosts share nothing (see
nshosts.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import GPT_TINY, HELLO, MESHRUN, ROOT, SCRIPTS, cli, meshrun, read_jsonl, wait_for
from errors_page import covers, exits
from hostsrun import listen_addr, run_args, start_joins

import meshrun as mr

PACED = str(SCRIPTS / "gpt_paced.py")
SLEEPER = str(SCRIPTS / "plain_sleeper.py")
DUMP_ENV = str(SCRIPTS / "dump_env.py")
TINY = GPT_TINY[: GPT_TINY.index("--fsdp")]
BATCH = 8


def token_env() -> dict:
    import secrets

    return {"MESHRUN_TOKEN": secrets.token_hex(32)}


def kill_host(hosts, h: int) -> None:
    """Host h is lost: every process in it dies at once."""
    for pid in hosts.pids(h):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def global_batches(log_dir) -> dict[tuple[int, int], list[int]]:
    """(attempt, step) -> the step's sample ids in rank order, for the
    steps every rank of the attempt logged (a step cut short by a kill is
    left out)."""
    parts: dict[tuple[int, int], dict[int, list[int]]] = {}
    for f in log_dir.glob("rank-*.jsonl"):
        rank = int(f.stem.split("-")[1])
        for r in read_jsonl(f):
            parts.setdefault((r["attempt"], r["step"]), {})[rank] = r["index"]
    whole = {}
    for key, by_rank in parts.items():
        ids = [i for rank in sorted(by_rank) for i in by_rank[rank]]
        if sorted(by_rank) == list(range(len(by_rank))) and len(ids) == BATCH:
            whole[key] = ids
    return whole


@pytest.mark.slow
def test_a_lost_host_shrinks_the_gpt_to_one_host_and_its_return_grows_it_back_with_the_same_samples_and_losses(nshosts, tmp_path, gpt_data, gpt_reference):
    """The GPT on 2 hosts x 1 process x 4 devices (fsdp 2 x tensor 2, data
    2); host 1 is killed for good after the first commit. The restart waits
    the rejoin timeout and runs on host 0 alone (data 1); once it has
    committed a checkpoint there, host 1 joins again and the run grows back
    to 2 hosts at its next report. Every step's sample ids (in rank order)
    equal those of a fixed-size run, its losses stay within 1e-4, and the
    run ends successfully. (The shrink to the largest host count that
    divides the most, and a count that does not, are decisions the
    controller's unit tests take on the simulated clock.)"""
    steps = 24
    train = [*TINY, "--fsdp", "2", "--tensor", "2", "--steps", str(steps)]
    launch = ["-n", "2", "--devices-per-proc", "4", "--tee", "none", "--checkpoint-every", "4"]
    # The fixed-size run: the suite's shared reference (2 processes x 2
    # devices, fsdp 2 x tensor 2, 30 steps), the same global batches, each
    # rank reading its half in rank order, and within 1e-4 the same math
    # on any mesh (test_gpt.py).
    ref = gpt_reference(*GPT_TINY, "--steps", "30")
    ref_batches = {step: ids for (_, step), ids in global_batches(ref.samples).items() if step <= steps}
    ref_loss = {step: loss for step, loss in ref.losses.items() if step <= steps}
    assert sorted(ref_batches) == list(range(1, steps + 1)) and len(ref_loss) == steps

    hosts = nshosts(2)
    env = token_env()
    samples = hosts.shared / "samples"
    samples.mkdir()
    shutil.copytree(gpt_data, hosts.shared / "data")
    args = run_args(hosts, [*launch, "--max-failures", "2", "--rejoin-timeout", "5", "--join-timeout", "120", PACED, *train, "--data-dir", str(hosts.shared / "data"), "--sample-log", str(samples)], "el", count="1:2")
    controller = hosts.popen(0, args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    joiners = start_joins(hosts, env, timeout=120)
    run_dir = hosts.tmp(0) / "runs" / "el"
    events = lambda kind: [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]  # noqa: E731
    try:
        wait_for(lambda: controller.poll() is not None or events("checkpoint_committed"), 300, "the first commit")
        assert controller.poll() is None, controller.communicate()[1]
        kill_host(hosts, 1)
        wait_for(lambda: controller.poll() is not None or [e for e in events("checkpoint_committed") if e["attempt"] == 2], 300, "a commit on 1 host")
        assert controller.poll() is None, controller.communicate()[1]
        back = hosts.popen(1, [str(MESHRUN), "join", listen_addr(hosts), "--join-timeout", "120"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, err = controller.communicate(timeout=600)
    finally:
        if controller.poll() is None:
            controller.kill()
    seen = "\n".join(json.dumps(e) for e in read_jsonl(run_dir / "events.jsonl"))[-8000:]
    assert controller.returncode == 0, f"{err}\n--- events:\n{seen}"
    assert back.wait(timeout=60) == 0, back.stdout.read()
    assert joiners[0].wait(timeout=60) != 0, "host 1's first agent was killed with its host"

    sized = [(e["attempt"], e["hosts"], e["previous_hosts"]) for e in events("resized")]
    assert sized == [(2, 1, 2), (3, 2, 1)], seen
    shrink = events("resized")[0]["reason"]
    assert "1 of 2 hosts came back within" in shrink and "shrinking from 2 to 1" in shrink, shrink
    assert [(e["from_hosts"], e["to_hosts"]) for e in events("growing")] == [(1, 2)]
    ended = {e["attempt"]: e["state"] for e in events("attempt_ended")}
    assert ended == {1: "failed", 2: "resized", 3: "succeeded"}, ended
    assert events("host_waiting"), "a host waited while 1 ran"

    # The data order and the math of a fixed-size run, on every host count.
    batches = global_batches(samples)
    assert {s for _, s in batches} == set(range(1, steps + 1))
    assert {a for a, _ in batches} == {1, 2, 3}
    for (attempt, step), ids in sorted(batches.items()):
        assert ids == ref_batches[step], f"attempt {attempt} step {step}"
    losses = [(m["attempt"], m["step"], m["metrics"]["loss"]) for m in read_jsonl(run_dir / "metrics.jsonl") if "loss" in m["metrics"]]
    assert {a for a, _, _ in losses} == {1, 2, 3}
    for attempt, step, loss in losses:
        assert abs(loss - ref_loss[step]) <= 1e-4, f"attempt {attempt} step {step}: {loss} vs {ref_loss[step]}"
    # What a resize cost is a part of the run's time of its own.
    goodput = json.loads((run_dir / "goodput.json").read_text())
    assert goodput["seconds"]["resize"] > 0, goodput["seconds"]


@pytest.mark.slow
@covers("run-too-few-hosts")
def test_fewer_than_min_hosts_left_waits_the_rejoin_timeout_then_ends_naming_the_hosts(nshosts):
    """`--hosts 2:4` on 2 hosts: the first attempt waits the rejoin timeout
    for the other two and starts on 2; host 1 is lost, and the restart, left
    with host 0 alone, waits the rejoin timeout and ends naming it."""
    hosts = nshosts(2)
    env = token_env()
    args = run_args(hosts, ["-n", "4", "--tee", "none", "--max-failures", "1", "--rejoin-timeout", "3", SLEEPER], "few", count="2:4")
    t0 = time.monotonic()
    controller = hosts.popen(0, args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (joiner,) = start_joins(hosts, env, timeout=10)
    try:
        wait_for(lambda: (hosts.shared / "few" / "ready-1").exists() or controller.poll() is not None, 60, "both hosts to run")
        assert controller.poll() is None, controller.communicate()
        assert time.monotonic() - t0 >= 3, "it waited for the other hosts first"
        kill_host(hosts, 1)
        lost = time.monotonic()
        out, err = controller.communicate(timeout=60)
    finally:
        if controller.poll() is None:
            controller.kill()
    exits("run-too-few-hosts", subprocess.CompletedProcess(args, controller.returncode, out, err))
    assert f"(host 0 ({hosts.addr(0)}))" in err, err
    assert 3 <= time.monotonic() - lost <= 30
    run_dir = hosts.tmp(0) / "runs" / "few"
    first = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "resized"]
    assert [(e["hosts"], e["previous_hosts"]) for e in first] == [(2, None)]
    assert "2 of 4 hosts joined within" in first[0]["reason"]


@pytest.mark.slow
def test_an_elastic_run_says_the_wait_it_keeps_and_the_host_count_it_starts_on(tmp_path):
    """`--hosts 1:2 --rejoin-timeout 2 --listen` with no host joining: it
    says it waits 2 s (the rejoin timeout, not the 300 s join timeout),
    then that attempt 1 starts on 1 of 2 hosts; `meshrun status` shows
    the attempt's host count."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    done = meshrun(["-n", "2", "--hosts", "1:2", "--rejoin-timeout", "2", "--listen", f"127.0.0.1:{port}", "--tee", "none", HELLO], runs_dir=tmp_path / "runs", name="one")
    assert done.code == 0, done.stderr
    assert time.monotonic() - t0 < 30, "it waited longer than it said"
    lines = done.stderr.splitlines()
    assert "meshrun: run 'one' waits up to 2 s for 1 more host(s), then starts on those there (--hosts 1:2): on each, run" in lines, done.stderr
    started = [line for line in lines if line.startswith("meshrun: attempt 1 starts")]
    assert len(started) == 1 and re.fullmatch(r"meshrun: attempt 1 starts on 1 of 2 hosts: 1 joined within [2-9] s", started[0]), done.stderr
    status = cli("status", "--runs-dir", tmp_path / "runs", "one")
    assert "  #  STATE      HOSTS  STARTED" in status.stdout, status.stdout
    assert re.search(r"^  1  succeeded  1      \d{4}-", status.stdout, re.M), status.stdout


@pytest.mark.slow
def test_the_local_backend_starts_every_host_and_tells_the_program_its_range(tmp_path):
    """On one machine meshrun starts all MAX hosts itself: the run is at
    MAX, not resized, and each worker is told MIN and MAX."""
    done = meshrun(["-n", "4", "--hosts", "2:4", "--tee", "none", DUMP_ENV], runs_dir=tmp_path / "runs", name="local")
    assert done.code == 0, done.stderr
    env = json.loads((done.run_dir / "env-3.json").read_text())
    assert (env["MESHRUN_WORLD_SIZE"], env["MESHRUN_NUM_HOSTS"]) == ("4", "4")
    assert (env["MESHRUN_MIN_WORLD_SIZE"], env["MESHRUN_MAX_WORLD_SIZE"]) == ("2", "4")
    assert "MESHRUN_RESIZE_REASON" not in env and "MESHRUN_PREVIOUS_WORLD_SIZE" not in env
    assert not [e for e in done.events() if e["event"] == "resized"]


def _context_fn():
    ctx = mr.get_context()
    mr.report({"world": ctx.world_size, "min": ctx.min_world_size, "max": ctx.max_world_size, "resized": ctx.resized, "hosts": ctx.num_hosts})


@pytest.mark.slow
def test_scaling_config_takes_a_worker_range_as_ray_train_spells_it(tmp_path):
    """``num_workers=(MIN, MAX)``: each worker its own host; the program is
    told the range."""
    result = mr.Trainer(_context_fn, scaling_config=mr.ScalingConfig(num_workers=(2, 4)), run_config=mr.RunConfig(storage_path=str(tmp_path / "runs"), tee="none")).fit()
    assert result.metrics == {"world": 4, "min": 2, "max": 4, "resized": False, "hosts": 4}


# JAX stays out of the test process (a later fork there would warn), so the
# check runs in a process of its own.
ACCUMULATE = """
import types
import jax, jax.numpy as jnp, numpy as np
import meshrun
from meshrun import elastic

rng = np.random.default_rng(0)
params = {"w": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32), "b": jnp.zeros(3)}
batch = {"x": jnp.asarray(rng.normal(size=(12, 5)), jnp.float32), "y": jnp.asarray(rng.normal(size=(12, 3)), jnp.float32)}

def loss(p, b):
    return jnp.mean((b["x"] @ p["w"] + p["b"] - b["y"]) ** 2)

whole_loss, whole_grads = jax.value_and_grad(loss)(params, batch)
for n in (1, 2, 3, 4):
    l, g = jax.jit(elastic.accumulate(loss, n))(params, batch)
    assert abs(float(l) - float(whole_loss)) < 1e-5, (n, float(l), float(whole_loss))
    for k in params:
        np.testing.assert_allclose(np.asarray(g[k]), np.asarray(whole_grads[k]), rtol=1e-5, atol=1e-6)
devices = jax.device_count()
assert elastic.micro_batches(12 * devices, 12) == 1
assert elastic.micro_batches(12 * devices, 5) == 3, "12 rows a device, at most 5: 3 parts of 4"
# Over a (data 2, fsdp 2, tensor 2) mesh the batch splits 4 ways.
mesh = types.SimpleNamespace(shape={"data": 2, "fsdp": 2, "tensor": 2})
assert elastic.micro_batches(16, 2, mesh) == 2
try:
    elastic.micro_batches(18, 4, mesh)
    raise SystemExit("no error")
except meshrun.ConfigError as e:
    assert "a global batch of 18 rows does not split over 4 devices" in str(e), e
print("ok")
"""


@pytest.mark.slow
def test_micro_batches_give_the_whole_batch_gradient():
    """``elastic.accumulate`` over micro-batches: the loss and gradients of
    the whole batch (a mean loss), and ``micro_batches`` the fewest parts
    that fit a per-device limit."""
    done = subprocess.run([sys.executable, "-c", ACCUMULATE], capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
