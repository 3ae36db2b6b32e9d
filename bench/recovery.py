"""Recovery time: from SIGKILL of one worker to the first completed training
step after the automatic restart, on three paths side by side.

Each round runs the demo GPT (``examples/gpt.py --fsdp 2 --tensor 2``,
2 processes x 2 CPU devices) under ``meshrun run --max-failures 1
--checkpoint-every 5``, waits until step 5 is committed and rank 0 has
reported step 7, then kills rank 1 with SIGKILL and records, from the run's
own ``events.jsonl`` and ``metrics.jsonl`` (times taken by the controller
and by rank 0) the time from the kill to the first training step of the
new attempt reported (rank 0 blocks on that step's loss before reporting
it), in consecutive parts that add up to it:

  detect    the failure recorded
  stop      the last worker of the failed attempt gone
  relaunch  the new attempt's workers started (or handed to spares)
  process   rank 0's process taking the attempt (a spare's handover, or a
            new interpreter's start)
  imports   its code up to the user's program (meshrun, JAX)
  join, restore, compile, data+save
            the restarted rank 0's own figures (``first_step`` event):
            ``jax.distributed``'s join, the restore, tracing and
            compilation (or loading the executables), the loader and saves
  first_step  the rest of rank 0's time to its first report: the step
  report    the report's way to the controller

beside a steady step of the first attempt.

  durable   the path before fast recovery: restore from the durable
            checkpoint (step 5), new interpreters (``--warm-spares off``)
  memory    a memory checkpoint every step (``--memory-checkpoint-every
            1``) and warm spares (the default with ``--max-failures``)
  executables  the memory path, with the executables and abstract shapes
            the first attempt traced and compiled loaded by the restart
            (``meshrun.jit``/``meshrun.eval_shape``; the other paths run
            the GPT with ``--compile-each-attempt``)
  cache off the durable path without the compilation cache
            (``--with-cache-off``)

Every round gets a scratch folder of its own (the compilation cache lives
there), so no round finds another's entries. Rounds alternate; the table
gives medians. ``--model small`` runs a 2-layer, 32-wide GPT instead.

    python bench/recovery.py [--rounds 3] [--model demo|small] [--modes M...] [--with-cache-off] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import jsonl, publish, wait

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MESHRUN = Path(sys.executable).parent / "meshrun"


SMALL = ["--batch-size", "8", "--seq-len", "32", "--d-model", "32", "--layers", "2", "--heads", "4"]
# meshrun's options, then the program's.
MODES = {
    "durable": (["--warm-spares", "off"], ["--compile-each-attempt"]),
    "memory": (["--memory-checkpoint-every", "1"], ["--compile-each-attempt"]),
    "executables": (["--memory-checkpoint-every", "1"], []),
    "cache off": (["--warm-spares", "off"], ["--compile-each-attempt"]),
}


def one_round(runs: Path, name: str, mode: str, steps: int, model: list[str]) -> dict[str, float]:
    env = dict(os.environ, MESHRUN_SCRATCH=str(runs / f"{name}-scratch"), MESHRUN_MEMORY_DIR=str(runs / f"{name}-memory"))
    if mode == "cache off":
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    run_dir = runs / name
    ours, program = MODES[mode]
    cmd = [str(MESHRUN), "run", "-n", "2", "--devices-per-proc", "2", "--platform", "cpu", "--tee", "none", "--runs-dir", str(runs), "--name", name, *ours]
    cmd += ["--max-failures", "1", "--checkpoint-every", "5", str(ROOT / "examples" / "gpt.py"), "--fsdp", "2", "--tensor", "2", "--steps", str(steps), "--eval-every", "100000", *model, *program]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        events = lambda kind: [e for e in jsonl(run_dir / "events.jsonl") if e["event"] == kind]  # noqa: E731
        wait(lambda: proc.poll() is not None or (any(e["step"] == 5 for e in events("checkpoint_committed")) and any((r["step"] or 0) >= 7 for r in jsonl(run_dir / "metrics.jsonl"))), 300, "step 7")
        if proc.poll() is not None:
            raise SystemExit(f"the run ended early: {proc.stderr.read()}")
        pid = next(e["pid"] for e in events("worker_started") if e["attempt"] == 1 and e["rank"] == 1)
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        wait(lambda: proc.poll() is not None or any(r["attempt"] == 2 and "loss" in r["metrics"] for r in jsonl(run_dir / "metrics.jsonl")), 300, "the first step after the restart")
        first = next(r for r in jsonl(run_dir / "metrics.jsonl") if r["attempt"] == 2 and "loss" in r["metrics"])
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    detect = events("worker_failed")[0]["time"]
    stopped = max(e["time"] for e in events("worker_exited") if e["attempt"] == 1)
    relaunch = max(e["time"] for e in events("worker_started") if e["attempt"] == 2)
    last = max((r["step"] or 0) for r in jsonl(run_dir / "metrics.jsonl") if r["attempt"] == 1 and r["time"] <= killed)
    # The newest step saved on every rank before the kill: rank 0 reports a
    # step before the save of that step commits, so a kill between the two
    # redoes one step by design.
    saved = [e["step"] for e in events("memory_checkpoint_committed") + events("checkpoint_committed") if e["attempt"] == 1 and e["time"] <= killed]
    attempt_1 = [r["time"] for r in jsonl(run_dir / "metrics.jsonl") if r["attempt"] == 1 and "loss" in r["metrics"]]
    steady = [b - a for a, b in zip(attempt_1, attempt_1[1:], strict=False)]
    return {
        "detect": detect - killed,
        "stopped": stopped - killed,
        "relaunch": relaunch - killed,
        "step": first["time"] - killed,
        "resumed_at_step": first["step"],
        # Steps rank 0 had reported before the kill that the restart redid
        # (none when the ranks saved a step rank 0 reported after the kill).
        "steps_lost": max(0, last - (first["step"] - 1)),
        "saved_before_kill": max(saved, default=0),
        "warm": all(e.get("warm", False) for e in events("worker_started") if e["attempt"] == 2),
        # Ranks whose restarted train step was loaded, not compiled.
        "loaded": sum(1 for e in events("executable") if e["attempt"] == 2 and e["name"].endswith(".train_step") and e["outcome"] == "loaded"),
        # A steady step of the first attempt (rank 0's reports), for the
        # restart's first step to be held against.
        "steady_step": statistics.median(steady[len(steady) // 2 :]),
        **timeline(killed, detect, stopped, relaunch, next(e for e in events("first_step") if e["attempt"] == 2), first["time"]),
    }


def timeline(killed: float, detect: float, stopped: float, relaunch: float, first_step: dict, reported: float) -> dict[str, float]:
    """The kill to the restart's first step in consecutive parts that add
    up to it: the controller's times (the failure recorded, the failed
    group gone, the new attempt's workers started), then rank 0's own
    figures sent with its first step (``first_step``): the process taking
    the attempt (a warm spare's handover, or a new interpreter's start),
    its code up to the user's (imports), the join of ``jax.distributed``,
    the restore, compilation or the executables' load, time in the data
    loader and in saves, the step itself (the rest of rank 0's time to its
    first report), and the report's way to the controller."""
    t = first_step["timing"]
    named = t["init"] + t["restore"] + t["compile"] + t["data"] + t["checkpoint"]
    parts = {
        "detect": detect - killed,
        "stop": stopped - detect,
        "relaunch": relaunch - stopped,
        "process": t["proc_start"] - relaunch,
        "imports": t["user_start"] - t["proc_start"],
        "join": t["init"],
        "restore": t["restore"],
        "compile": t["compile"],
        "data+save": t["data"] + t["checkpoint"],
        "first_step": t["now"] - t["user_start"] - named,
        "report": first_step["time"] - t["now"],
        "recorded": reported - first_step["time"],
    }
    return {f"part_{k}": v for k, v in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000, help="the run's length (it is stopped after the restart's first step)")
    parser.add_argument("--model", choices=("demo", "small"), default="demo")
    parser.add_argument("--with-cache-off", action="store_true", help="also the durable path without the compilation cache")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), help="only these paths")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    modes = args.modes or ["durable", "memory", "executables"] + (["cache off"] if args.with_cache_off else [])
    model = SMALL if args.model == "small" else []
    rounds: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        for i in range(args.rounds):
            order = modes if i % 2 == 0 else modes[::-1]
            for mode in order:
                rounds[mode].append(one_round(runs, f"{mode.replace(' ', '-')}-{i}", mode, args.steps, model))
    keys = [k for k in rounds[modes[0]][0] if k not in ("resumed_at_step", "warm", "loaded")]
    med = {m: {k: statistics.median(r[k] for r in rs) for k in keys} for m, rs in rounds.items()}
    rows = []
    for m in modes:
        x = med[m]
        parts = {k.removeprefix("part_"): x[k] for k in keys if k.startswith("part_")}
        rows.append((m, f"first step {x['step']:.2f} s (steady step {x['steady_step']:.2f} s), steps redone {x['steps_lost']:.0f}; "
                        + " + ".join(f"{k} {v:.2f}" for k, v in parts.items()) + f" = {sum(parts.values()):.2f} s"))
    base = modes[0]
    result = {"model": args.model, "rounds": rounds, "median": med, "speedup_over": base, "speedup": {m: med[base]["step"] / med[m]["step"] for m in modes}}
    summary = f"SIGKILL to first step after restart ({args.model} GPT): " + ", ".join(f"{m} {med[m]['step']:.2f} s ({result['speedup'][m]:.2f}x {base})" for m in modes)
    publish("Recovery (medians, seconds after the SIGKILL)", ("path", "timeline"), rows, summary, result, args.json)


if __name__ == "__main__":
    main()
