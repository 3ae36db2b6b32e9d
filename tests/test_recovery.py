"""Failures, hangs and preemption end in a restart that resumes exactly:
real workers killed with real signals, real checkpoints, real restarts."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest
from conftest import GPT, GPT_LAUNCH, GPT_TINY, SCRIPTS, alive, assert_none_left, meshrun, read_jsonl, start, stop, wait_for

# Each test kills, hangs or preempts a training run and waits for it to
# restart and finish: 10 s to minutes each.
pytestmark = pytest.mark.slow

EXAMPLE, TINY, LAUNCH = GPT, GPT_TINY, GPT_LAUNCH


def events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]


def final_records(log_dir: Path, rank: int) -> dict[int, dict]:
    """Step -> the record of the last attempt that ran it: steps redone after
    a restart replace what the failed attempt did past its checkpoint."""
    out: dict[int, dict] = {}
    for rec in read_jsonl(log_dir / f"rank-{rank}.jsonl"):
        if rec["step"] not in out or rec["attempt"] >= out[rec["step"]]["attempt"]:
            out[rec["step"]] = rec
    return out


def soak(tmp_path: Path, data_dir: str, gpt_reference, kills: int, steps: int, seed: int, memory: bool = False) -> None:
    """The GPT on 2 processes x 2 devices, checkpointing every 2 steps, is
    killed with SIGKILL ``kills`` times (every other time just as a
    checkpoint folder appears, i.e. during a save) and must finish with the
    same parameters, bit for bit, as an uninterrupted run, having trained
    on every sample of the uninterrupted run exactly once. With ``memory``,
    it keeps a memory checkpoint every step (and a durable one every 10):
    then each restart may redo at most one step."""
    rng = random.Random(seed)
    runs, data = tmp_path / "runs", ["--data-dir", data_dir]
    ref = gpt_reference(*TINY, "--steps", str(steps))
    ref_log, soak_log = ref.samples, tmp_path / "soak-samples"
    soak_log.mkdir()
    every = "10" if memory else "2"
    common = [*LAUNCH, "--checkpoint-every", every]

    run_dir = runs / "soak"
    args = [*common, *(["--memory-checkpoint-every", "1"] if memory else []), "--max-failures", str(kills + 2), EXAMPLE, *TINY, "--steps", str(steps), *data, "--sample-log", str(soak_log), "--params-digest", str(tmp_path / "soak.sha")]
    proc = start(args, runs_dir=runs, name="soak")
    killed = []
    try:
        for k in range(kills):
            attempt = k + 1

            def training() -> bool:
                return proc.poll() is not None or any(r["attempt"] == attempt and (r["step"] or 0) >= 1 for r in read_jsonl(run_dir / "metrics.jsonl"))

            wait_for(training, 120, f"attempt {attempt} to train (seed {seed})")
            if proc.poll() is not None:
                break
            if k % 2:
                # During a save: as soon as a rank starts writing one.
                saves = (run_dir / "checkpoints").glob("tmp-*") if not memory else Path(os.environ["MESHRUN_MEMORY_DIR"]).glob("*/host-0/tmp-*")
                deadline = time.monotonic() + 30
                while proc.poll() is None and time.monotonic() < deadline and not list(saves):
                    time.sleep(0.002)
                    saves = (run_dir / "checkpoints").glob("tmp-*") if not memory else Path(os.environ["MESHRUN_MEMORY_DIR"]).glob("*/host-0/tmp-*")
            else:
                time.sleep(rng.uniform(0.0, 1.0))
            rank = rng.randrange(2)
            pid = next(e["pid"] for e in events(run_dir, "worker_started") if e["attempt"] == attempt and e["rank"] == rank)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                break  # the run ended just now
            killed.append((attempt, rank))
            wait_for(lambda: proc.poll() is not None or events(run_dir, "attempt_started")[-1]["attempt"] > attempt, 60, f"the restart after kill {k} (seed {seed})")
        out, err = proc.communicate(timeout=600)
    finally:
        stop(proc)
    assert proc.returncode == 0, f"seed {seed}: {err}"
    assert_none_left(run_dir)
    assert len(killed) == kills, f"seed {seed}: the run finished after {len(killed)} of {kills} kills; give it more steps"
    restarts = events(run_dir, "restarting")
    assert len(restarts) == kills
    assert (tmp_path / "soak.sha").read_text() == ref.digest, f"seed {seed}: final parameters differ from the uninterrupted run"

    for rank in (0, 1):
        want = final_records(ref_log, rank)
        got = final_records(soak_log, rank)
        assert sorted(got) == list(range(1, steps + 1)), f"seed {seed}: rank {rank} steps {sorted(got)}"
        for s in got:
            assert got[s]["index"] == want[s]["index"], f"seed {seed}: rank {rank} step {s} read other samples"
        trained = [i for s in sorted(got) for i in got[s]["index"]]
        assert len(trained) == len(set(trained)), f"seed {seed}: rank {rank} trained a sample twice"
    # Every restart resumed from the newest checkpoint committed before it.
    for r in restarts:
        assert r["from_step"] is None or r["from_step"] % int(every) == 0
    # Steps redone: the steps an attempt completed (rank 0 reported their
    # loss) past the step the next one resumed from (a memory checkpoint's,
    # or storage's). A step still in flight at the kill was not completed.
    resumed = {e["attempt"]: e["step"] for e in events(run_dir, "resuming")}
    resumed.update({e["attempt"]: e["step"] for e in events(run_dir, "resuming_from_memory")})
    trained: dict[int, int] = {}
    for rec in read_jsonl(run_dir / "metrics.jsonl"):
        if "loss" in rec["metrics"]:
            trained[rec["attempt"]] = max(trained.get(rec["attempt"], 0), rec["step"])
    redone = [trained.get(a, 0) - resumed.get(a + 1, 0) for a in range(1, kills + 1)]
    print(f"soak seed {seed}: {kills} kills {killed}, restarts from {[r['from_step'] for r in restarts]}, "
          f"memory restores {sorted(e['step'] for e in events(run_dir, 'resuming_from_memory'))}, steps redone {redone} (sum {sum(redone)}), "
          f"{len(events(run_dir, 'checkpoint_discarded'))} uncommitted checkpoint folders removed")
    if memory:
        assert sum(redone) <= kills, f"seed {seed}: {sum(redone)} steps redone over {kills} restarts: {redone}"
    # Every restart loaded the train step attempt 1 compiled (meshrun.jit):
    # rank 0's word precedes its report of a step, which the soak waits
    # for before each kill; the last attempt was not killed, so both
    # ranks' words are in.
    steps = {(e["attempt"], e["rank"]): e for e in events(run_dir, "executable") if e["name"].endswith(".train_step")}
    last = kills + 1
    assert steps[(1, 0)]["outcome"] == "compiled", steps
    for attempt, rank in [(a, 0) for a in range(2, last)] + [(last, 0), (last, 1)]:
        assert steps[(attempt, rank)]["outcome"] == "loaded", f"seed {seed}: attempt {attempt} rank {rank}: {steps.get((attempt, rank))}"
    assert not [e for e in events(run_dir, "executable") if e["outcome"] == "stale"]


@pytest.mark.bench_smoke
def test_sigkill_soak_with_memory_checkpoints(tmp_path, gpt_data, gpt_reference):
    seed = int(os.environ.get("MESHRUN_SOAK_SEED", str(random.randrange(1 << 30))))
    soak(tmp_path, gpt_data, gpt_reference, kills=int(os.environ.get("MESHRUN_SOAK_KILLS", "2")), steps=int(os.environ.get("MESHRUN_SOAK_STEPS", "30")), seed=seed, memory=True)


@pytest.mark.bench_smoke
def test_sigkill_soak_short(tmp_path, gpt_data, gpt_reference):
    seed = int(os.environ.get("MESHRUN_SOAK_SEED", str(random.randrange(1 << 30))))
    soak(tmp_path, gpt_data, gpt_reference, kills=int(os.environ.get("MESHRUN_SOAK_KILLS", "2")), steps=int(os.environ.get("MESHRUN_SOAK_STEPS", "30")), seed=seed)


def test_hang_is_detected_with_stacks_and_restarted(tmp_path):
    runs = tmp_path / "runs"
    # The hang timeout counts from a worker's start too (a rank may hang
    # before its first report): 8 s, more than a loaded machine takes to
    # start and compile the first step (4 s was seen to be missed).
    done = meshrun(["-n", "2", "--platform", "cpu", "--tee", "none", "--hang-timeout", "8", "--max-failures", "1", str(SCRIPTS / "hang_once.py")], runs_dir=runs, timeout=120)
    assert done.code == 0, done.stderr
    stuck_at = float((done.run_dir / "stuck-at").read_text())
    failed = events(done.run_dir, "worker_failed")
    assert len(failed) == 1 and failed[0]["cause"]["kind"] == "hang"
    assert failed[0]["time"] - stuck_at <= 8 + 5, f"hang detected {failed[0]['time'] - stuck_at:.1f} s after it began"
    stacks = done.run_dir / "stacks" / "attempt-1"
    # Each rank's stacks, and the flight recorder's calls across processes.
    assert sorted(p.name for p in stacks.iterdir()) == ["calls.txt", "rank-0.txt", "rank-1.txt"]
    # The wavefront: rank 0 is in a call (step 3's gather) rank 1 never made.
    wavefront = failed[0]["cause"]["wavefront"]
    assert re.match(r"calls across processes, newest first: rank 0: in call (\d+), .*; rank 1: in call (\d+), ", wavefront), wavefront
    assert "in stuck_in_step" in (stacks / "rank-1.txt").read_text()
    assert "hang_once.py" in (stacks / "rank-0.txt").read_text()
    assert not (done.run_dir / "stacks" / "attempt-2").exists(), "an attempt without a failure keeps no stacks"
    ended = [(e["attempt"], e["state"]) for e in events(done.run_dir, "attempt_ended")]
    assert ended == [(1, "failed"), (2, "succeeded")]
    stopped = events(done.run_dir, "worker_exited")[:2]
    assert all(e["time"] - failed[0]["time"] < 2.0 for e in stopped), "the hung group took more than 2 s to stop"
    assert "done in attempt 2" in done.log(0)


def test_preemption_checkpoints_then_the_same_name_resumes(tmp_path, gpt_data):
    runs, data = tmp_path / "runs", ["--data-dir", gpt_data]
    run_dir = runs / "pre"
    # No regular checkpoint before step 1000: the one saved is preemption's.
    args = [*LAUNCH, "--checkpoint-every", "1000", EXAMPLE, *TINY, "--steps", "30", *data]
    proc = start(args, runs_dir=runs, name="pre")
    try:
        wait_for(lambda: proc.poll() is not None or any((r["step"] or 0) >= 3 for r in read_jsonl(run_dir / "metrics.jsonl")), 120, "training")
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 75, err
    assert_none_left(run_dir)
    # Every rank saves at each report from the request on, so that they meet
    # on a common step; the first commit stops the group, and steps that
    # commit while it stops are newer still.
    committed = [e["step"] for e in events(run_dir, "checkpoint_committed")]
    preempting = events(run_dir, "preempting")
    assert len(preempting) == 1 and committed
    assert all(e["time"] > preempting[0]["time"] for e in events(run_dir, "checkpoint_committed"))
    # One commit ends it: no rank trains or saves past that step, and the
    # group is gone at once.
    assert len(committed) == 1, committed
    step = committed[0]
    assert 3 <= step < 30
    assert max((r["step"] or 0) for r in read_jsonl(run_dir / "metrics.jsonl")) == step
    stopping = events(run_dir, "stopping")[0]["time"]
    assert all(e["time"] - stopping < 0.5 for e in events(run_dir, "worker_exited"))
    assert f"preempted: every worker saved checkpoint step-{step}" in err
    assert json.loads((run_dir / "run.json").read_text())["state"] == "preempted"

    again = meshrun([*LAUNCH, "--checkpoint-every", "1000", EXAMPLE, *TINY, "--steps", "30", *data], runs_dir=runs, name="pre", timeout=300)
    assert again.code == 0, again.stderr
    assert f"gpt: resumed from step {step}" in again.log(0)
    resumed = sorted(r["step"] for r in again.metrics() if r["attempt"] == 2 and "loss" in r["metrics"])
    assert resumed == list(range(step + 1, 31))


def test_used_up_restarts_end_the_run_with_every_attempt_summarised(tmp_path):
    done = meshrun(["-n", "2", "--platform", "cpu", "--tee", "none", "--max-failures", "2", str(SCRIPTS / "raise_rank1.py")], runs_dir=tmp_path / "runs", timeout=120)
    assert done.code == 1
    assert "failed 3 times, more than --max-failures 2 allows" in done.stderr
    assert "attempt 1: rank 1 raised ValueError: boom from rank 1" in done.stderr
    assert "attempt 2: rank 1 raised ValueError: boom from rank 1" in done.stderr
    assert "failed (attempt 3): rank 1 raised ValueError" in done.stderr
    assert done.stderr.count("restarting from the start (no meshrun checkpoint; the program restores its own, if it keeps any)") == 2
    # The attempts that were restarted failed; the run failed once, at the end.
    assert done.stderr.count("meshrun: attempt 1 of run 't' failed: rank 1 raised ValueError") == 1
    assert done.stderr.count("run 't' failed (attempt") == 1
    record = json.loads((done.run_dir / "run.json").read_text())
    assert [a["state"] for a in record["attempts"]] == ["failed", "failed", "failed"]
    assert record["state"] == "failed"


def test_a_killed_agent_is_a_failure_that_restarts(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "agents"
    proc = start(["-n", "2", "--hosts", "2", "--platform", "cpu", "--tee", "none", "--max-failures", "1", str(SCRIPTS / "plain_sleeper.py")], runs_dir=runs, name="agents")
    try:
        wait_for(lambda: proc.poll() is not None or all((run_dir / f"ready-{r}").exists() for r in (0, 1)), 60, "workers")
        agent = next(e["pid"] for e in events(run_dir, "agent_joined") if e["host"] == 1)
        os.kill(agent, signal.SIGKILL)
        wait_for(lambda: len(events(run_dir, "attempt_started")) == 2 and len(events(run_dir, "worker_started")) == 4, 60, "the restart")
        failed = events(run_dir, "worker_failed")
        assert failed[0]["cause"]["kind"] in ("agent_lost", "connection_lost", "exit"), failed
        # The dead agent's worker could not be stopped through it: it ends
        # itself when the failed attempt drops its control connection.
        first = [e["pid"] for e in events(run_dir, "worker_started") if e["attempt"] == 1]
        wait_for(lambda: not any(alive(p) for p in first), 10, "the first attempt's workers to be gone")
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode == 130
    assert_none_left(run_dir)


def test_a_frozen_worker_is_caught_by_its_missing_heartbeats(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "frozen"
    proc = start(["-n", "2", "--platform", "cpu", "--tee", "none", str(SCRIPTS / "sleeper.py")], runs_dir=runs, name="frozen")
    try:
        wait_for(lambda: proc.poll() is not None or all((run_dir / f"ready-{r}").exists() for r in (0, 1)), 60, "workers")
        pid = next(e["pid"] for e in events(run_dir, "worker_started") if e["rank"] == 1)
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.time()
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 1
    failed = events(run_dir, "worker_failed")[0]
    assert failed["rank"] == 1 and failed["cause"]["kind"] == "unresponsive"
    assert 9 <= failed["time"] - stopped_at <= 15
    assert "stopped sending heartbeats" in err
    assert_none_left(run_dir)


@pytest.mark.own_compile_cache
def test_every_rank_finds_its_compilation_in_the_cache_on_a_restart(tmp_path):
    """JAX itself writes cache entries from process 0 only, and on CPU each
    process's key differs: meshrun lets every rank write its own, so a
    restarted rank 1 loads its step instead of compiling it."""
    runs = tmp_path / "runs"
    args = ["-n", "2", "--platform", "cpu", "--tee", "none", str(SCRIPTS / "cached_step.py")]
    first = meshrun(args, runs_dir=runs, name="cache")
    assert first.code == 0, first.stderr
    # The cache is host-local: in the scratch folder (one per test, see conftest).
    entries = [p.name for p in (Path(os.environ["MESHRUN_SCRATCH"]) / "compile-cache").iterdir() if p.name.startswith("jit_cached_step-")]
    assert len(entries) == 2, entries
    again = meshrun(args, runs_dir=runs, name="cache", env={"JAX_LOG_COMPILES": "1"})
    assert again.code == 0, again.stderr
    log = again.log(1).split("attempt 2")[-1]
    assert "Persistent compilation cache hit for 'jit_cached_step'" in log, log[-3000:]
