"""How a worker's program ends, and how it joins (or fails to join)
``jax.distributed``, as the user sees it: ``sys.exit`` on one rank of a JAX
program, a peer killed under a collective, a multi-process run whose ranks
never joined, explicit arguments to ``jax.distributed.initialize``, and
function-mode tracebacks."""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import SCRIPTS, assert_none_left, freeze_agent_and_kill_worker, meshrun, read_jsonl, start, stop, wait_for

import meshrun as mr

WARNING = "never called jax.distributed.initialize()"


def _stopped_within(done, seconds: float) -> None:
    """Every rank ended within ``seconds`` of the failure being recorded."""
    events = done.events()
    failed = next(e for e in events if e["event"] == "worker_failed")
    ends = [e for e in events if e["event"] == "worker_exited"]
    assert len(ends) == 2, events
    slowest = max(e["time"] for e in ends) - failed["time"]
    assert slowest < seconds, f"the group took {slowest:.1f} s to stop"


def test_sys_exit_in_a_jax_program_stops_the_group_at_once(runs):
    # Measured: 2 to 3 s on 2 shared cores (mostly JAX's start-up);
    # without the report, JAX's shutdown barrier held rank 1 for 300 s.
    t0 = time.monotonic()
    done = meshrun(["-n", "2", "-q", str(SCRIPTS / "jax_exit_code.py")], runs_dir=runs, timeout=60)
    wall = time.monotonic() - t0
    assert done.code == 1, done.stderr
    assert wall < 15, f"{wall:.1f} s"
    assert "rank 1 ended with exit code 3 (called sys.exit(3))" in done.stderr
    assert 'jax_exit_code.py", line 14, in <module>' in done.stderr
    assert "_bootstrap.py" not in done.stderr
    assert "rank 0 stopped by meshrun" in done.stderr
    failed = next(e for e in done.events() if e["event"] == "worker_failed")
    assert failed["rank"] == 1
    assert failed["cause"]["kind"] == "system_exit" and failed["cause"]["code"] == 3
    _stopped_within(done, 2.0)


def test_sys_exit_with_a_message_is_exit_code_1(runs):
    done = meshrun(["-n", "2", "-q", str(SCRIPTS / "jax_exit_code.py"), "no data on this rank"], runs_dir=runs, timeout=60)
    assert done.code == 1, done.stderr
    assert "rank 1 ended with exit code 1 (called sys.exit('no data on this rank'))" in done.stderr
    # Python prints the message, as it would without meshrun.
    assert "no data on this rank" in done.log(1)
    _stopped_within(done, 2.0)


def test_a_peer_killed_under_a_collective_leaves_no_traceback_of_meshrun(runs):
    proc = start(["-n", "2", "--tee", "none", str(SCRIPTS / "peer_dies.py")], runs_dir=runs, name="peer")
    run_dir = runs / "peer"
    try:
        wait_for(lambda: proc.poll() is not None or ((run_dir / "waiting-1").exists() and (run_dir / "paused-0").exists()), 120, "both ranks at step 5")
        events = read_jsonl(run_dir / "events.jsonl")
        worker = next(e["pid"] for e in events if e["event"] == "worker_started" and e["rank"] == 1)
        agent = next(e["pid"] for e in events if e["event"] == "agent_joined")
        # Frozen, the agent cannot tell of rank 1's end, so meshrun cannot
        # stop rank 0 before rank 0 has been through its own failure.
        try:
            freeze_agent_and_kill_worker(agent, worker)
            (run_dir / "go").touch()
            wait_for(lambda: (run_dir / "exiting-0").exists(), 30, "rank 0 to begin its exit")
        finally:
            os.kill(agent, signal.SIGCONT)
        proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 1
    log = (run_dir / "logs" / "rank-0.log").read_text()
    # The program's own error, where it met it, as Python prints it...
    assert 'peer_dies.py", line' in log and "Gloo all-reduce failed" in log, log
    # ...and no traceback of meshrun's own: the record of step 5, whose
    # value can never be read, is dropped and counted.
    assert "reporting.py" not in log and "_values.py" not in log, log
    assert "During handling of the above exception" not in log, log
    assert "meshrun: 1 metric record could not be read and was dropped (step 5): JaxRuntimeError: " in log, log
    assert_none_left(run_dir)


@pytest.mark.slow
def test_ranks_that_never_join_are_warned_about_once(runs):
    done = meshrun(["-n", "2", "-q", str(SCRIPTS / "independent_copies.py")], runs_dir=runs, name="apart")
    assert done.code == 0, done.stderr
    terminal = done.stdout + done.stderr
    assert terminal.count(WARNING) == 1, terminal
    assert "rank 0 of 2 never called jax.distributed.initialize()" in terminal
    assert "MESHRUN_INDEPENDENT=1" in terminal
    assert done.log(0).count(WARNING) == 1
    assert WARNING not in done.log(1)

    quiet = meshrun(["-n", "2", "-q", str(SCRIPTS / "independent_copies.py")], runs_dir=runs, name="meant", env={"MESHRUN_INDEPENDENT": "1"})
    assert quiet.code == 0, quiet.stderr
    assert WARNING not in quiet.stdout + quiet.stderr + quiet.log(0)


def test_explicit_initialize_arguments_are_replaced_by_the_runs(runs):
    done = meshrun(["-n", "2", "-q", str(SCRIPTS / "explicit_init.py")], runs_dir=runs, timeout=60)
    assert done.code == 0, done.stderr
    for rank in (0, 1):
        log = done.log(rank)
        assert f"process {rank} of 2" in log, log
        assert "coordinator_address 'localhost:10000' -> '127.0.0.1:" in log, log
        assert "num_processes 1 -> 2" in log, log
    # Rank 0's id was right; only rank 1's is replaced.
    assert "process_id 0 ->" not in done.log(0)
    assert "process_id 0 -> 1" in done.log(1)


def test_function_mode_traceback_names_the_users_file_and_line(tmp_path):
    def train(config):
        raise ValueError(f"bad learning rate {config['lr']}")

    raise_line = train.__code__.co_firstlineno + 1
    with pytest.raises(mr.TrainingFailedError) as info:
        mr.Trainer(
            train,
            train_loop_config={"lr": -1},
            scaling_config=mr.ScalingConfig(num_workers=1),
            run_config=mr.RunConfig(name="fn", storage_path=str(tmp_path / "runs"), progress=False),
        ).fit()
    result = info.value.result
    assert result.status == "failed"
    where = f'{__file__}", line {raise_line}, in train'
    assert where in str(result.error), str(result.error)
    assert "<dynamic-code>" not in str(result.error)
    log = (tmp_path / "runs" / "fn" / "logs" / "rank-0.log").read_text()
    assert where in log, log
    assert_none_left(tmp_path / "runs" / "fn")


def test_local_device_ids_outside_the_workers_gpus_are_replaced(monkeypatch):
    # No GPU needed: only the decision, from the environment contract.
    from meshrun import _cluster

    monkeypatch.setenv("MESHRUN_COORDINATOR", "127.0.0.1:1234")
    monkeypatch.setenv("MESHRUN_WORLD_SIZE", "2")
    monkeypatch.setenv("MESHRUN_RANK", "1")
    monkeypatch.setenv("MESHRUN_GPUS", "4,5")
    run = {"coordinator_address": "127.0.0.1:1234", "num_processes": 2, "process_id": 1}
    assert _cluster._contradictions({**run, "local_device_ids": [0, 1]}) == []
    assert _cluster._contradictions({**run, "local_device_ids": 1}) == []
    # JAX's example passes the process id as the device: GPU 2 of 2 does not exist.
    assert _cluster._contradictions({**run, "local_device_ids": [2]}) == [("local_device_ids", [2], None)]
    assert _cluster._contradictions({**run, "local_device_ids": [0, 0]}) == [("local_device_ids", [0, 0], None)]
    assert _cluster._contradictions({"process_id": 0}) == [("process_id", 0, 1)]
    # On CPU, JAX ignores local_device_ids: nothing to replace.
    monkeypatch.delenv("MESHRUN_GPUS")
    assert _cluster._contradictions({**run, "local_device_ids": [7]}) == []


def test_the_compilation_cache_hook_leaves_a_jax_of_another_shape_alone(monkeypatch):
    """A cache writer not of the shape this JAX's version has (0.11 took
    one argument fewer than 0.10) must be left alone, or every compile
    fails (seen on a GPU machine with JAX 0.11.2 before the hook knew its
    shape); the shapes it knows are tested on each JAX by tests/compat."""
    from jax._src import compiler

    from meshrun import _jax_private

    def newer(cache_key, compile_time_secs, module_name, backend, executable):
        return "newer"

    monkeypatch.setattr(compiler, "_cache_write", newer)
    _jax_private.cache_from_every_process()
    assert compiler._cache_write is newer

    def current(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
        return "current"

    monkeypatch.setattr(compiler, "_cache_write", current)
    _jax_private.cache_from_every_process()
    assert compiler._cache_write is not current and compiler._cache_write._meshrun
