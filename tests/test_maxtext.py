"""MaxText, unmodified, under meshrun: its pre-training trainer
(``maxtext.trainers.pre_train.train``) with a tiny config on 2 processes x 2
CPU devices, once uninterrupted and once with a rank SIGKILLed after
MaxText's first periodic checkpoint. meshrun restarts the run; MaxText
resumes from its own Orbax checkpoint (meshrun's checkpoints play no part)
and must reach the last step with the losses of the uninterrupted run.

MaxText needs Python 3.12 and its own packages: the venv is made from
compat/maxtext/requirements.lock by ``make test-maxtext``, which runs the
long form (the uninterrupted run beside the killed one). In ``make test``
this file runs its short form (the killed run alone, its redone steps
compared with the ones the killed attempt had done) when the venv is there,
and is skipped otherwise.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, alive, assert_none_left, read_jsonl, stop, wait_for

VENV = Path(os.environ.get("MESHRUN_MAXTEXT_VENV", ROOT / ".compat" / "maxtext-py3.12"))
MESHRUN = VENV / "bin" / "meshrun"
# The long form: an uninterrupted run too, and every step compared with it.
FULL = os.environ.get("MESHRUN_MAXTEXT_FULL") == "1"
STEPS = int(os.environ.get("MESHRUN_MAXTEXT_STEPS", "40"))
PERIOD = 10  # MaxText's checkpoint_period: the kill waits for checkpoint PERIOD
KILLED_RANK = int(os.environ.get("MESHRUN_MAXTEXT_KILL_RANK", "1"))

pytestmark = [
    pytest.mark.slow,
    # MaxText's JAX is not the suite's: its programs get meshrun's default.
    pytest.mark.own_compile_cache,
    pytest.mark.skipif(
        not MESHRUN.exists(),
        reason=f"no MaxText venv with meshrun at {VENV}: `make test-maxtext` makes it from compat/maxtext/requirements.lock",
    ),
]

LAUNCH = ["-n", "2", "--devices-per-proc", "2", "--tee", "none", "-q"]

# MaxText's keys (its configs/base.yml): a 2-layer llama2-style decoder of
# width 64 on synthetic data (the same batch every step: stateless, so a
# resume needs nothing but MaxText's own checkpoint), float32 on CPU.
TINY = [
    "hardware=cpu",
    "dataset_type=synthetic",
    "base_num_decoder_layers=2",
    "base_emb_dim=64",
    "base_num_query_heads=4",
    "base_num_kv_heads=4",
    "head_dim=16",
    "base_mlp_dim=256",
    "vocab_size=256",
    "max_target_length=64",
    "per_device_batch_size=1",
    "dtype=float32",
    "attention=dot_product",
    "learning_rate=1e-3",
    "enable_checkpointing=true",
    f"checkpoint_period={PERIOD}",
    "enable_tensorboard=false",
    "log_config=false",
    # Empty: no compilation cache of MaxText's own in ~/jax_cache.
    "jax_cache_dir=",
]

COMPLETED = re.compile(r"completed step: (\d+), .*?loss: ([0-9.]+)")
RESTORED = re.compile(r"restoring from this run's directory step (\d+)")


def base_yml() -> str:
    """MaxText's configs/base.yml inside the installed package."""
    out = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", "import importlib.util, os; "
         "print(os.path.join(importlib.util.find_spec('maxtext').submodule_search_locations[0], 'configs', 'base.yml'))"],
        capture_output=True, text=True, check=True, timeout=60,
    )
    return out.stdout.strip()


def command(tmp: Path, name: str) -> list[str]:
    """``meshrun run`` of MaxText's trainer. MaxText writes its metrics
    (JSON lines) to ``metrics_file``, which meshrun follows as the run's
    steps (``--metrics-file``; the loss shown is MaxText's ``learning/loss``,
    found by name)."""
    metrics = tmp / f"{name}.metrics.jsonl"
    return [
        str(MESHRUN), "run", *LAUNCH, "--runs-dir", str(tmp / "runs"), "--name", name, "--max-failures", "1",
        "--metrics-file", str(metrics),
        "-m", "maxtext.trainers.pre_train.train", base_yml(), *TINY, f"steps={STEPS}",
        f"base_output_directory={tmp / 'maxtext'}", f"run_name={name}", f"metrics_file={metrics}",
    ]


def events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]


def losses(metrics_file: Path) -> dict[int, list[float]]:
    """Step -> every loss MaxText wrote for it, in file order. Each process
    appends its own line per step to the one file, and a restarted attempt
    appends the steps it redoes after the killed attempt's."""
    out: dict[int, list[float]] = {}
    if not metrics_file.exists():
        return out
    for line in metrics_file.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # two processes' appends can meet at step 0, where MaxText truncates
        out.setdefault(int(rec["step"]), []).append(rec["learning/loss"])
    return out


def attempt_log(run_dir: Path, rank: int, attempt: int) -> str:
    """One attempt's part of a rank's log (meshrun heads each attempt)."""
    text = (run_dir / "logs" / f"rank-{rank}.log").read_text()
    parts = re.split(r"^===== meshrun attempt (\d+), rank \d+, .*=====$", text, flags=re.M)
    return "".join(body for num, body in zip(parts[1::2], parts[2::2]) if int(num) == attempt)


def printed_losses(log: str) -> dict[int, float]:
    return {int(s): float(v) for s, v in COMPLETED.findall(log)}


def run_uninterrupted(tmp: Path) -> tuple[dict[int, list[float]], float]:
    name = "ref"
    start = time.monotonic()
    proc = subprocess.Popen(command(tmp, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        stop(proc)
    took = time.monotonic() - start
    run_dir = tmp / "runs" / name
    assert proc.returncode == 0, err[-3000:]
    assert_none_left(run_dir)
    assert [e["state"] for e in events(run_dir, "attempt_ended")] == ["succeeded"]
    return losses(tmp / f"{name}.metrics.jsonl"), took


def run_killed(tmp: Path) -> tuple[Path, float, float]:
    """The run with rank KILLED_RANK SIGKILLed once MaxText has committed
    its checkpoint of step PERIOD; returns its folder, when the kill came
    (seconds after the start) and how long the run took."""
    name = "killed"
    run_dir, ckpt = tmp / "runs" / name, tmp / "maxtext" / name / "checkpoints" / str(PERIOD)
    start = time.monotonic()
    proc = subprocess.Popen(command(tmp, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)

    def past_checkpoint() -> bool:
        # Orbax writes a step to <step>.orbax-checkpoint-tmp and renames it
        # to <step> once committed; MaxText trains on meanwhile. Two steps
        # past it, so that the restarted attempt redoes steps the killed one did.
        return ckpt.is_dir() and max(losses(tmp / f"{name}.metrics.jsonl"), default=-1) >= PERIOD + 2

    try:
        wait_for(lambda: proc.poll() is not None or past_checkpoint(), 480, f"MaxText's checkpoint of step {PERIOD}")
        assert proc.poll() is None, f"the run ended before its checkpoint of step {PERIOD}: {proc.communicate()[1][-3000:]}"
        pid = next(e["pid"] for e in events(run_dir, "worker_started") if e["attempt"] == 1 and e["rank"] == KILLED_RANK)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic() - start
        wait_for(lambda: not alive(pid), 10, f"rank {KILLED_RANK} ({pid}) to die")
        _, err = proc.communicate(timeout=600)
    finally:
        stop(proc)
    took = time.monotonic() - start
    assert proc.returncode == 0, err[-3000:]
    assert_none_left(run_dir)
    print("\nwhat meshrun said:\n" + "\n".join("  " + line for line in err.splitlines() if line.startswith("meshrun")))
    return run_dir, killed_at, took


@pytest.mark.timeout(900)
def test_maxtext_resumes_from_its_own_checkpoint_after_a_sigkill(tmp_path):
    reference, ref_took = run_uninterrupted(tmp_path) if FULL else ({}, 0.0)
    run_dir, killed_at, took = run_killed(tmp_path)

    # meshrun saw the kill and restarted once.
    failed = events(run_dir, "worker_failed")
    assert [(e["attempt"], e["rank"]) for e in failed][:1] == [(1, KILLED_RANK)], failed
    assert len(events(run_dir, "restarting")) == 1
    assert [(e["attempt"], e["state"]) for e in events(run_dir, "attempt_ended")] == [(1, "failed"), (2, "succeeded")]
    print("meshrun's events of the restart:")
    for e in read_jsonl(run_dir / "events.jsonl"):
        if e["event"] in ("worker_failed", "attempt_ended", "restarting", "attempt_started"):
            print("  " + json.dumps(e))

    # MaxText resumed from its own checkpoint, on every rank, and reached the last step.
    first = attempt_log(run_dir, 0, 1)
    second = attempt_log(run_dir, 0, 2)
    assert not RESTORED.search(first), "the first attempt restored a checkpoint"
    restored = {int(s) for rank in (0, 1) for s in RESTORED.findall(attempt_log(run_dir, rank, 2))}
    assert len(restored) == 1, f"ranks restored steps {restored}"
    step = restored.pop()
    assert step >= PERIOD and step % PERIOD == 0 and step < STEPS - 1, f"restored step {step}"
    done_first, done_second = printed_losses(first), printed_losses(second)
    assert max(done_first) < STEPS - 1, "the killed attempt had already finished"
    assert sorted(done_second) == list(range(step + 1, STEPS)), f"the second attempt ran steps {sorted(done_second)}"

    got = losses(tmp_path / "killed.metrics.jsonl")
    assert sorted(got) == list(range(STEPS)), sorted(got)
    # The steps both attempts ran: the killed one before the kill, the
    # restarted one again from the checkpoint.
    redone = [s for s in range(step + 1, STEPS) if s in done_first]
    print(f"MaxText restored step {step}; rank {KILLED_RANK} SIGKILLed {killed_at:.1f} s after the start, at step "
          f"{max(done_first)}; steps {redone[0] if redone else '-'}..{redone[-1] if redone else '-'} redone; "
          f"killed run {took:.1f} s" + (f", uninterrupted run {ref_took:.1f} s" if FULL else ""))

    # meshrun followed MaxText's metrics file as the run's steps, to the last one.
    records = read_jsonl(run_dir / "metrics.jsonl")
    followed = {(r["attempt"], r["step"]): r["metrics"]["learning/loss"] for r in records}
    assert len(followed) == len(records), "a step was reported twice in one attempt"
    assert max(s for a, s in followed if a == 2) == STEPS - 1, sorted(followed)
    # To the last bit: meshrun reports each step once, from its first line.
    differ = [(a, s, v, got[s]) for (a, s), v in followed.items() if v not in got[s]]
    assert not differ, f"(attempt, step, meshrun's loss, MaxText's) that differ: {differ}"

    mismatches = []
    if FULL:
        assert sorted(reference) == list(range(STEPS)), sorted(reference)
        print(f"{'step':>5} {'uninterrupted':>15} {'killed, resumed':>16}  attempts that ran it")
        for s in range(STEPS):
            want, final = reference[s][-1], got[s][-1]
            print(f"{s:>5} {want:>15.9f} {final:>16.9f}  {'1' if s <= step else '1, 2' if s in redone else '2'}")
            # Every line of a step (each process's, each attempt's) against
            # the uninterrupted run's.
            mismatches += [(s, want, v) for v in got[s] + reference[s] if v != want]
    else:
        assert redone, "the killed attempt ran no step past the checkpoint it was killed after: nothing to compare"
        for s in redone:
            want = got[s][0]
            mismatches += [(s, want, v) for v in got[s] if v != want]
    # MaxText restores its whole train state (parameters, optimizer state,
    # step) and the synthetic batch is the same every step, on the same
    # compiled program: the losses are bit-identical, not merely close.
    assert not mismatches, f"(step, loss wanted, loss written) that differ: {mismatches}"
