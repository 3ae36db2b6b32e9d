"""Recovery time: from SIGKILL of one worker to the first completed training
step after the automatic restart, with and without JAX's compilation cache.

Each round runs the demo GPT (``examples/gpt.py --fsdp 2 --tensor 2``,
2 processes x 2 CPU devices) under ``meshrun run --max-failures 1
--checkpoint-every 5``, waits until step 5 is committed and rank 0 has
reported step 7, then kills rank 1 with SIGKILL and records, from the run's
own ``events.jsonl`` and ``metrics.jsonl`` (times taken by the controller):

  detect    the failure recorded
  stopped   the last worker of the failed attempt gone
  relaunch  the new attempt's workers started
  step      the first training step of the new attempt reported (rank 0
            blocks on that step's loss before reporting it)

"cache off" sets ``JAX_ENABLE_COMPILATION_CACHE=false`` for the workers;
"cache on" is meshrun's default (the cache in each host's scratch folder,
so the restarted attempt finds everything attempt 1 compiled; every round
gets a scratch folder of its own, so no round finds another's entries). Rounds
alternate; the table gives medians.

    python bench/recovery.py [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import publish

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MESHRUN = Path(sys.executable).parent / "meshrun"


def jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file the run is still appending to: a last
    line caught half-written is skipped, as every reader of a run does."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")


def one_round(runs: Path, name: str, cache: bool, steps: int) -> dict[str, float]:
    env = dict(os.environ, MESHRUN_SCRATCH=str(runs / f"{name}-scratch"))
    if not cache:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    run_dir = runs / name
    cmd = [str(MESHRUN), "run", "-n", "2", "--devices-per-proc", "2", "--platform", "cpu", "--tee", "none", "--runs-dir", str(runs), "--name", name]
    cmd += ["--max-failures", "1", "--checkpoint-every", "5", str(ROOT / "examples" / "gpt.py"), "--fsdp", "2", "--tensor", "2", "--steps", str(steps), "--eval-every", "100000"]
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
    return {
        "detect": detect - killed,
        "stopped": stopped - killed,
        "relaunch": relaunch - killed,
        "step": first["time"] - killed,
        "resumed_at_step": first["step"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000, help="the run's length (it is stopped after the restart's first step)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {"cache on": [], "cache off": []}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        for i in range(args.rounds):
            order = ("cache on", "cache off") if i % 2 == 0 else ("cache off", "cache on")
            for label in order:
                rounds[label].append(one_round(runs, f"{label.replace(' ', '-')}-{i}", label == "cache on", args.steps))
    med = {label: {k: statistics.median(r[k] for r in rs) for k in ("detect", "stopped", "relaunch", "step")} for label, rs in rounds.items()}
    rows = []
    for label in ("cache on", "cache off"):
        m = med[label]
        rows.append((label, f"detected {m['detect']:.2f} s, group stopped {m['stopped']:.2f} s, relaunched {m['relaunch']:.2f} s, first step {m['step']:.2f} s"))
    result = {"rounds": rounds, "median": med, "cache_speedup": med["cache off"]["step"] / med["cache on"]["step"]}
    summary = f"SIGKILL to first step after restart: {med['cache on']['step']:.2f} s with the cache, {med['cache off']['step']:.2f} s without ({result['cache_speedup']:.2f}x)"
    publish("Recovery (medians, seconds after the SIGKILL)", ("compilation cache", "timeline"), rows, summary, result, args.json)


if __name__ == "__main__":
    main()
