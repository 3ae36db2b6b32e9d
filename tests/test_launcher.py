"""``meshrun run`` end to end: real processes, real jax.distributed, real signals."""

from __future__ import annotations

import errno
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import HELLO, MESHRUN, ROOT, SCRIPTS, alive, assert_none_left, cli, meshrun, start, stop, wait_for
from errors_page import covers, exits, snapshot
from hostsrun import meshrun_on


def test_unmodified_initialize_joins_the_run(runs):
    done = meshrun(["-n", "2", "--devices-per-proc", "2", str(SCRIPTS / "plain_init.py"), "--flag", "x"], runs_dir=runs)
    assert done.code == 0, done.stderr
    for rank in (0, 1):
        rec = json.loads((done.run_dir / f"plain-{rank}.json").read_text())
        assert rec["process_index"] == rank
        assert rec["process_count"] == 2
        assert rec["device_count"] == 4
        assert rec["local_device_count"] == 2
        assert rec["gathered"] == [0, 1]
        assert rec["argv"] == ["--flag", "x"]
    # rank 0's output is teed to the terminal, rank 1's only to its log
    assert "joined 0 of 2" in done.stdout
    assert "joined 1 of 2" not in done.stdout
    assert "joined 1 of 2" in done.log(1)
    # Gloo's connection lines stay in the logs, out of the terminal (no -v)
    assert "[Gloo]" in done.log(0)
    assert "[Gloo]" not in done.stdout + done.stderr
    assert "connected peer ranks" not in done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.own_compile_cache  # it checks where each host's cache goes
def test_env_contract_with_two_hosts(nshosts):
    """Two hosts that share nothing: host 1 joins over the network."""
    hosts = nshosts(2)
    done = meshrun_on(
        hosts,
        ["-n", "4", "--devices-per-proc", "3", "--platform", "cpu", str(SCRIPTS / "dump_env.py")],
        env={"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=true --xla_force_host_platform_device_count=9"},
    )
    assert done.code == 0, done.stderr
    assert [code for code, _ in done.joins] == [0], done.joins
    envs = [json.loads((done.storage_dir / f"env-{r}.json").read_text()) for r in range(4)]
    coordinators = {e["MESHRUN_COORDINATOR"] for e in envs}
    assert len(coordinators) == 1
    coordinator = coordinators.pop()
    host, port = coordinator.rsplit(":", 1)
    assert host == hosts.addr(0)
    # the coordinator listens on host 0's address only, not every interface
    assert {e["JAX_COORDINATOR_BIND_ADDRESS"] for e in envs} == {coordinator}
    for rank, e in enumerate(envs):
        assert e["MESHRUN_RANK"] == str(rank)
        assert e["MESHRUN_WORLD_SIZE"] == "4"
        assert e["MESHRUN_LOCAL_RANK"] == str(rank % 2)
        assert e["MESHRUN_LOCAL_WORLD_SIZE"] == "2"
        assert e["MESHRUN_HOST_RANK"] == str(rank // 2)
        assert e["MESHRUN_NUM_HOSTS"] == "2"
        assert e["MESHRUN_HOST_IP"] == hosts.addr(rank // 2)
        assert e["MESHRUN_ATTEMPT"] == "1"
        # the run folder is the controller's (host 0's /tmp); workers write
        # to the storage
        assert e["MESHRUN_RUN_DIR"] == "/tmp/runs/t"
        assert e["MESHRUN_STORAGE_DIR"] == str(done.storage_dir)
        assert e["JAX_PLATFORMS"] == "cpu"
        # the user's flags are kept, the device count is meshrun's
        assert e["XLA_FLAGS"] == "--xla_cpu_use_thunk_runtime=true --xla_force_host_platform_device_count=3"
        # each host's cache is its own, in its scratch folder
        assert e["JAX_COMPILATION_CACHE_DIR"] == f"{hosts.scratch_path}/compile-cache"
        assert e["MESHRUN_SCRATCH"].startswith(f"{hosts.scratch_path}/runs/")
        # Each worker holds a credential of its own, and never the run
        # token, though both the controller and the joining host had it.
        assert e["worker_key_length"] == 64 and "MESHRUN_TOKEN" not in e
        assert "CUDA_VISIBLE_DEVICES" not in e
        # The launchers' contracts (docs/migrating.md), as their programs read them.
        assert {k: e[k] for k in ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "JAX_COORDINATOR_IP", "MASTER_ADDR")} == dict.fromkeys(
            ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "JAX_COORDINATOR_IP", "MASTER_ADDR"), host
        )
        assert e["JAX_COORDINATOR_PORT"] == e["COORDINATOR_PORT"] == e["MASTER_PORT"] == port
        assert (e["PROCESS_ID"], e["NUM_PROCESSES"]) == (str(rank), "4")  # Kubeflow JAXJob
        job = int(e["JOB_INDEX"]) * int(e["PROCESSES_IN_JOB"]) + int(e["JOB_COMPLETION_INDEX"])
        assert (job, e["JAX_PROCESS_COUNT"]) == (rank, "4")  # indexed Job, MaxText's CPU path
        assert (e["NODE_RANK"], e["NNODES"]) == (str(rank), "4")  # MaxText's GPU path
        torchrun = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")
        assert [e[k] for k in torchrun] == [str(rank), "4", str(rank % 2), "2", str(rank // 2), "2", "0"]
    assert len({e["worker_key_digest"] for e in envs}) == 4
    agents = [e for e in done.events() if e["event"] == "agent_joined"]
    assert sorted((a["host"], a["ip"]) for a in agents) == [(0, hosts.addr(0)), (1, hosts.addr(1))]
    run = json.loads((done.run_dir / "run.json").read_text())
    assert run["state"] == "succeeded"
    assert run["attempts"][-1]["control"]["loopback_only"] is False
    assert run["plan"]["hosts"] == 2


@pytest.mark.slow
@pytest.mark.own_compile_cache
def test_env_contract_with_two_local_hosts(runs):
    """--hosts on one machine: agent processes on loopback addresses."""
    done = meshrun(["-n", "4", "--hosts", "2", "--platform", "cpu", str(SCRIPTS / "dump_env.py")], runs_dir=runs)
    assert done.code == 0, done.stderr
    envs = [json.loads((done.run_dir / f"env-{r}.json").read_text()) for r in range(4)]
    assert [e["MESHRUN_HOST_IP"] for e in envs] == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    assert all(e["JAX_COMPILATION_CACHE_DIR"] == str(Path(os.environ["MESHRUN_SCRATCH"]) / "compile-cache") for e in envs)
    assert all(e["MESHRUN_STORAGE_DIR"] == str(done.run_dir) for e in envs)
    run = json.loads((done.run_dir / "run.json").read_text())
    assert run["attempts"][-1]["control"]["loopback_only"] is True


def test_collectives_across_two_hosts(nshosts):
    hosts = nshosts(2)
    done = meshrun_on(hosts, ["-n", "2", "--devices-per-proc", "2", str(SCRIPTS / "plain_init.py")])
    assert done.code == 0, done.stderr
    rec = json.loads((done.storage_dir / "plain-1.json").read_text())
    assert rec["gathered"] == [0, 1] and rec["device_count"] == 4


def test_gpu_assignment_uses_physical_ids_never_shared(runs):
    # A fake inventory: the GPUs a scheduler left visible. No GPU is needed,
    # the script only reads its environment.
    done = meshrun(
        ["-n", "2", "--platform", "cuda", "--gpus-per-proc", "2", str(SCRIPTS / "dump_env.py")],
        runs_dir=runs,
        env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"},
    )
    assert done.code == 0, done.stderr
    envs = [json.loads((done.run_dir / f"env-{r}.json").read_text()) for r in range(2)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4,5", "6,7"]
    assert all(e["JAX_PLATFORMS"] == "cuda" for e in envs)
    assert all(e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for e in envs)


def test_module_mode_and_argv(runs):
    done = meshrun(["-n", "2", "-m", "pkg.train", "--lr", "0.1", "-x"], runs_dir=runs, cwd=SCRIPTS)
    assert done.code == 0, done.stderr
    rec = json.loads((done.run_dir / "module-1.json").read_text())
    assert rec == {"argv": ["--lr", "0.1", "-x"], "name": "__main__"}


@pytest.mark.slow
def test_tee_all_prefixes_and_logs_every_attempt(runs):
    done = meshrun(["-n", "2", "--tee", "all", str(SCRIPTS / "hello.py")], runs_dir=runs)
    assert done.code == 0, done.stderr
    assert "[0] hello from rank 0" in done.stdout
    assert "[1] hello from rank 1" in done.stdout
    assert "[1] err from rank 1" in done.stderr
    again = meshrun(["-n", "2", str(SCRIPTS / "hello.py")], runs_dir=runs)
    assert again.code == 0
    log = again.log(1)
    assert "meshrun attempt 1, rank 1" in log and "meshrun attempt 2, rank 1" in log
    assert log.count("hello from rank 1") == 2
    run = json.loads((again.run_dir / "run.json").read_text())
    assert [a["attempt"] for a in run["attempts"]] == [1, 2]


@pytest.mark.slow
def test_rank_that_raises_stops_the_group(runs):
    t0 = time.monotonic()
    done = meshrun(["-n", "2", str(SCRIPTS / "raise_rank1.py")], runs_dir=runs)
    assert done.code == 1
    assert time.monotonic() - t0 < 60  # not JAX's 300 s shutdown barrier
    summary = done.stderr
    assert "rank 1 raised ValueError: boom from rank 1" in summary
    assert 'raise_rank1.py", line 10, in <module>' in summary
    assert "_bootstrap.py" not in summary
    assert "rank 0 stopped by meshrun" in summary
    events = done.events()
    failed = next(e for e in events if e["event"] == "worker_failed")
    assert failed["rank"] == 1 and failed["cause"]["kind"] == "exception"
    rank0_end = next(e for e in events if e["event"] == "worker_exited" and e["rank"] == 0)
    assert rank0_end["time"] - failed["time"] < 2.0, "rank 0 was not stopped within 2 s"
    assert "ValueError: boom from rank 1" in done.log(1)
    run = json.loads((done.run_dir / "run.json").read_text())
    assert run["state"] == "failed"
    assert run["attempts"][0]["failure"]["rank"] == 1


def test_nonzero_exit_is_a_failure_with_output_tail(runs):
    done = meshrun(["-n", "2", str(SCRIPTS / "exit_code.py")], runs_dir=runs)
    assert done.code == 1
    assert "rank 1 ended with exit code 3" in done.stderr
    assert "| rank 1 giving up" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 128 + 15), (signal.SIGINT, 128 + 2)])
def test_signal_to_meshrun_stops_the_whole_tree(runs, sig, code):
    proc = start(["-n", "2", "--hosts", "2", str(SCRIPTS / "sleeper.py")], runs_dir=runs, name="sig")
    run_dir = runs / "sig"
    try:
        wait_for(lambda: proc.poll() is not None or all((run_dir / f"ready-{r}").exists() for r in (0, 1)), 90, "both ranks to start")
        proc.send_signal(sig)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=20)
        assert time.monotonic() - t0 < 5
    finally:
        stop(proc)
    assert proc.returncode == code
    assert "interrupted" in err
    assert_none_left(run_dir)
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"


def test_killed_controller_takes_its_workers_along(runs):
    # SIGKILL cannot be handled: the workers notice the controller's
    # connection closing and end themselves.
    proc = start(["-n", "2", str(SCRIPTS / "sleeper.py")], runs_dir=runs, name="orphan")
    run_dir = runs / "orphan"
    try:
        wait_for(lambda: proc.poll() is not None or all((run_dir / f"ready-{r}").exists() for r in (0, 1)), 90, "both ranks to start")
        proc.kill()
        proc.communicate(timeout=10)
    finally:
        stop(proc)
    assert_none_left(run_dir, timeout=10)



def test_the_coordinators_port_is_held_from_launch_until_jax_binds_it(runs):
    """Between the launch and rank 0's `jax.distributed.initialize()`, the
    coordinator's port is refused to any other process (a port probe, a
    server's bind), and JAX still binds it: before, another process could
    take it in that window and rank 0 crashed."""
    proc = start(["-n", "2", "--tee", "none", str(SCRIPTS / "coordinator_port.py")], runs_dir=runs, name="port")
    run_dir = runs / "port"
    try:
        wait_for(lambda: proc.poll() is not None or (run_dir / "coordinator").exists(), 90, "rank 0 to say where its coordinator listens")
        host, port = (run_dir / "coordinator").read_text().rsplit(":", 1)
        with socket.socket() as other, pytest.raises(OSError) as refused:
            other.bind((host, int(port)))
        assert refused.value.errno == errno.EADDRINUSE
        (run_dir / "go").touch()
        wait_for(lambda: proc.poll() is not None or all((run_dir / f"ready-{r}").exists() for r in (0, 1)), 90, "both ranks to join")
        assert proc.poll() is None
    finally:
        stop(proc)
    assert_none_left(run_dir)


def test_workers_report_metrics_to_rank0_file(runs, tmp_path):
    script = tmp_path / "rep.py"
    script.write_text(
        "import meshrun\n"
        "ctx = meshrun.get_context()\n"
        "for s in range(5):\n"
        "    meshrun.report({'step': s, 'loss': 1.0 / (s + 1), 'rank': ctx.rank})\n"
    )
    done = meshrun(["-n", "2", str(script)], runs_dir=runs)
    assert done.code == 0, done.stderr
    recs = done.metrics()
    assert [r["step"] for r in recs] == [0, 1, 2, 3, 4]
    assert all(r["metrics"]["rank"] == 0 for r in recs)
    assert recs[-1]["metrics"]["loss"] == pytest.approx(0.2)


def test_processes_are_group_leaders(runs, tmp_path):
    # A worker's child is stopped with it: the group goes as a whole.
    script = tmp_path / "spawner.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "open(os.path.join(os.environ['MESHRUN_RUN_DIR'], f\"child-{os.environ['MESHRUN_RANK']}\"), 'w').write(str(child.pid))\n"
        "assert os.getpgid(0) == os.getpid()\n"
        "if os.environ['MESHRUN_RANK'] == '1':\n"
        "    time.sleep(1)\n"
        "    raise RuntimeError('rank 1 fails')\n"
        "time.sleep(300)\n"
    )
    done = meshrun(["-n", "2", str(script)], runs_dir=runs)
    assert done.code == 1
    assert "rank 1 raised RuntimeError: rank 1 fails" in done.stderr
    children = [int((done.run_dir / f"child-{r}").read_text()) for r in (0, 1)]
    wait_for(lambda: not any(alive(p) for p in children), 5, "grandchildren to be stopped")


def test_wrong_token_is_refused_while_the_run_goes_on(runs):
    from meshrun import _native

    proc = start(["-n", "1", str(SCRIPTS / "sleeper.py")], runs_dir=runs, name="guarded")
    run_dir = runs / "guarded"
    try:
        wait_for(lambda: proc.poll() is not None or (run_dir / "ready-0").exists(), 90, "the run to start")
        addr = json.loads((run_dir / "run.json").read_text())["attempts"][-1]["control"]["bind"]
        with pytest.raises(_native.ControlError):
            _native.WorkerClient(addr, "ab" * 32, 0, 1, False)
        assert proc.poll() is None, "the run was harmed by a refused client"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
        stop(proc)
    assert_none_left(run_dir)


@pytest.mark.slow
def test_a_workers_credential_cannot_join_as_a_host_or_speak_as_another_rank(runs):
    """Workers never hold the run token, though the run was given it in
    MESHRUN_TOKEN: each holds a credential of its own rank and attempt.
    With it, `meshrun join` is refused as a host and it cannot speak as
    another rank; the run goes on unharmed."""
    from meshrun import _native

    token = secrets.token_hex(32)
    proc = start(["-n", "2", "--tee", "none", str(SCRIPTS / "hold_credential.py")], runs_dir=runs, name="held", env={"MESHRUN_TOKEN": token})
    run_dir = runs / "held"
    try:
        wait_for(lambda: proc.poll() is not None or all((run_dir / f"cred-{r}.json").exists() for r in (0, 1)), 90, "both workers to start")
        held = [json.loads((run_dir / f"cred-{r}.json").read_text()) for r in (0, 1)]
        assert not any(h["token_here"] for h in held), held
        keys = [h["key"] for h in held]
        assert all(len(k) == 64 for k in keys) and keys[0] != keys[1] and token not in keys
        addr = json.loads((run_dir / "run.json").read_text())["attempts"][-1]["control"]["bind"]
        # As a host: the credential is not the run token.
        joined = cli("join", addr, "--join-timeout", "5", env={"MESHRUN_TOKEN": keys[0]})
        assert joined.returncode == 1 and "did not accept this host's run token" in joined.stderr, joined.stderr
        # As another rank. (A stop asked for on a worker's credential is
        # refused by the controller: `server::tests`.)
        with pytest.raises(_native.ControlError):
            _native.WorkerClient(addr, keys[0], 1, 1, False)
        assert proc.poll() is None, "the run was harmed by a refused credential"
        (run_dir / "release").touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        stop(proc)
    assert_none_left(run_dir)


# Rows of docs/errors.md: the mistakes `meshrun run` refuses, and a run
# whose runs directory or program fails. Each checks that nothing already
# written was lost or altered.

USAGE = {
    "run-nprocs-zero": ["-n", "0", HELLO],
    "run-nprocs-not-a-number": ["-n", "x", HELLO],
    "run-nprocs-negative": ["-n", "-1", HELLO],
    "run-option-misspelt": ["--nproc", "2", HELLO],
    "run-resume-from-bad": ["--resume-from", "latest", HELLO],
    "run-hosts-zero": ["--hosts", "0", HELLO],
    "run-hosts-do-not-divide": ["-n", "2", "--hosts", "3", HELLO],
    "run-too-many-hosts": ["-n", "300", "--hosts", "300", HELLO],
    "run-devices-zero": ["--devices-per-proc", "0", HELLO],
    "run-gpus-not-there": ["--gpus-per-proc", "1", HELLO],
    "run-gpus-on-cpu": ["--platform", "cpu", "--gpus-per-proc", "1", HELLO],
    "run-platform-unknown": ["--platform", "tpu9", HELLO],
    "run-tee-unknown": ["--tee", "some", HELLO],
    "run-no-program": [],
    "run-script-missing": ["missing_script.py"],
    "run-script-is-a-directory": [str(SCRIPTS)],
    "run-script-does-not-compile": [str(SCRIPTS / "does_not_compile.py")],
    "run-module-not-found": ["-m", "no_such_module_here"],
    "run-module-name-bad": ["-m", "not a module"],
    "run-name-with-slash": ["--name", "a/b", HELLO],
    "run-name-dot-dot": ["--name", "..", HELLO],
    "run-name-dot-dot-inside": ["--name", "x..", HELLO],
    "run-name-leading-dash": ["--name=-x", HELLO],
    "run-checkpoint-every-zero": ["--checkpoint-every", "0", HELLO],
    "run-keep-checkpoints-zero": ["--keep-checkpoints", "0", HELLO],
    "run-keep-every-zero": ["--keep-every-n-steps", "0", HELLO],
    "run-score-order-unknown": ["--checkpoint-score-order", "best", HELLO],
    "run-hang-timeout-zero": ["--hang-timeout", "0", HELLO],
    "run-hang-timeout-nan": ["--hang-timeout", "nan", HELLO],
    "run-start-timeout-zero": ["--start-timeout", "0", HELLO],
    "run-straggler-threshold-zero": ["--straggler-threshold", "0", HELLO],
    "run-straggler-steps-zero": ["--straggler-steps", "0", HELLO],
    "run-profile-steps-backwards": ["--profile-steps", "5:2", HELLO],
    "run-memory-every-zero": ["--memory-checkpoint-every", "0", HELLO],
    "run-spare-import-bad": ["--spare-imports", "jax numpy", HELLO],
    "run-warm-spares-unknown": ["--warm-spares", "maybe", HELLO],
    "run-max-failures-negative": ["--max-failures", "-1", HELLO],
    "run-ray-strategy-unknown": ["--ray", "auto", "--ray-strategy", "FOO", HELLO],
    "run-control-host-not-an-ip": ["--control-host", "nothost", HELLO],
    # 192.0.2.0/24 is reserved for documentation: never this machine's.
    "run-control-host-elsewhere": ["--control-host", "192.0.2.1", HELLO],
    "run-listen-one-host": ["--listen", "127.0.0.1:29400", HELLO],
    "run-listen-unspecified": ["-n", "2", "--hosts", "2", "--listen", "0.0.0.0:29400", HELLO],
    "run-listen-elsewhere": ["-n", "2", "--hosts", "2", "--listen", "192.0.2.1:29400", HELLO],
    "run-listen-with-ray": ["-n", "2", "--hosts", "2", "--listen", "127.0.0.1:29400", "--ray", "auto", HELLO],
    "run-join-timeout-zero": ["--join-timeout", "0", HELLO],
    "run-hosts-range-bad": ["-n", "4", "--hosts", "3:2", HELLO],
    "run-hosts-not-a-range": ["--hosts", "2-4", HELLO],
    "run-rejoin-timeout-without-range": ["--hosts", "2", "-n", "2", "--rejoin-timeout", "5", HELLO],
    "run-rejoin-timeout-zero": ["-n", "2", "--hosts", "1:2", "--rejoin-timeout", "0", HELLO],
}
covers(*USAGE)


@covers("run-storage-not-a-folder")
def test_a_storage_that_is_a_file_is_refused(finished_run, tmp_path):
    before = snapshot(finished_run)
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = cli("run", "--runs-dir", finished_run, "--storage", afile, HELLO)
    exits("run-storage-not-a-folder", proc)
    assert snapshot(finished_run) == before and afile.read_text() == "x"


@covers("run-listen-port-taken")
def test_a_listen_port_in_use_is_refused(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("run", "--runs-dir", tmp_path / "runs", "-n", "2", "--hosts", "2", "--listen", f"127.0.0.1:{port}", HELLO)
        exits("run-listen-port-taken", proc)
        assert f"--listen 127.0.0.1:{port}: the port is in use" in proc.stderr
    assert not (tmp_path / "runs").exists()


JOIN_USAGE = {
    "join-no-token": (["127.0.0.1:9"], {}),
    "join-token-file-missing": (["127.0.0.1:9", "--token-file", "missing"], {}),
    "join-slurm-node-id-bad": (["127.0.0.1:9"], {"MESHRUN_TOKEN": "ab" * 32, "SLURM_NODEID": "x"}),
    "join-address-bad": (["head-node"], {"MESHRUN_TOKEN": "ab" * 32}),
}
covers(*JOIN_USAGE)


@pytest.mark.parametrize("row", sorted(JOIN_USAGE))
def test_usage_errors_of_join(row, tmp_path):
    args, env = JOIN_USAGE[row]
    clean = {k: v for k, v in os.environ.items() if k not in ("MESHRUN_TOKEN", "SLURM_NODEID")}
    proc = subprocess.run([str(MESHRUN), "join", *args], capture_output=True, text=True, timeout=30, cwd=tmp_path, env={**clean, **env})
    exits(row, proc)


@covers("join-nobody-listens")
def test_join_gives_up_when_nobody_listens(tmp_path):
    token = tmp_path / "token"
    token.write_text("ab" * 32)
    t0 = time.monotonic()
    proc = cli("join", "127.0.0.1:9", "--token-file", token, "--join-timeout", "1")
    exits("join-nobody-listens", proc)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("row", sorted(USAGE))
def test_usage_errors_of_run(row, finished_run):
    before = snapshot(finished_run)
    proc = cli("run", "--runs-dir", finished_run, *USAGE[row], env={"CUDA_VISIBLE_DEVICES": ""})
    exits(row, proc)
    # One style, whether the grammar or meshrun refused it.
    assert proc.stderr.startswith("meshrun: error: "), proc.stderr
    assert snapshot(finished_run) == before, "the runs directory was changed"


@covers("run-runs-dir-is-a-file")
def test_runs_dir_below_a_file(tmp_path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    exits("run-runs-dir-is-a-file", cli("run", "--runs-dir", blocker / "runs", HELLO))
    assert blocker.read_text() == "keep me"


@covers("run-runs-dir-read-only")
def test_runs_dir_on_a_read_only_file_system():
    # Root ignores permission bits; procfs refuses everyone.
    exits("run-runs-dir-read-only", cli("run", "--runs-dir", "/proc/meshrun-runs", HELLO))


@covers("run-runs-dir-full")
def test_runs_dir_on_a_full_file_system(tmp_path):
    # A small tmpfs of its own, in a private mount namespace, filled up.
    full = tmp_path / "full"
    full.mkdir()
    script = f"""set -e
mount -t tmpfs -o size=64k tmpfs {full}
mkdir {full}/runs && echo kept > {full}/runs/notes.txt
head -c 1M /dev/zero > {full}/filler 2>/dev/null || true
{MESHRUN} run --runs-dir {full}/runs {HELLO} && exit 99 || status=$?
test "$(cat {full}/runs/notes.txt)" = kept && test "$(ls {full}/runs)" = notes.txt || exit 98
exit $status
"""
    proc = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode not in (98, 99), f"the run started, or the runs directory changed: {proc.stderr}"
    exits("run-runs-dir-full", proc)


@covers("run-runs-dir-fills-up")
def test_runs_dir_that_fills_up_during_the_run(tmp_path):
    full, kept = tmp_path / "full", tmp_path / "kept"
    full.mkdir()
    script = f"""mount -t tmpfs -o size=256k tmpfs {full} || exit 97
{MESHRUN} run -q --runs-dir {full}/runs --name f {SCRIPTS / "fill_disk.py"}
status=$?
cp -r {full}/runs/f {kept}
exit $status
"""
    proc = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    exits("run-runs-dir-fills-up", proc)
    assert_none_left(kept)
    # What was written before the disk filled up is whole: the record of
    # the run, every event, every metric but a last line cut short.
    assert json.loads((kept / "run.json").read_text())["name"] == "f"
    assert not list(kept.glob(".*.tmp")), "a half-written copy was left behind"
    assert [json.loads(line)["event"] for line in (kept / "events.jsonl").read_text().splitlines()][-1] == "run_ended"
    metrics = (kept / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics[:-1]] == list(range(len(metrics) - 1))


@covers("run-worker-fails")
def test_a_failed_worker_keeps_its_logs_and_metrics(tmp_path):
    # A JAX program, as users' are: its exit is reported before JAX's
    # shutdown barrier can hold it (minutes, then SIGABRT).
    done = meshrun(["-n", "2", "-q", str(SCRIPTS / "jax_exit_code.py")], runs_dir=tmp_path / "runs", name="fails", timeout=60)
    exits("run-worker-fails", done)
    assert "rank 1 giving up" in done.log(1)
    assert (done.run_dir / "run.json").exists() and (done.run_dir / "events.jsonl").exists()
