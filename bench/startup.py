"""Startup overhead of ``meshrun run``, measured side by side in one run.

Times, alternately, the same 10-step job (bench/startup_job.py) on
2 processes x 2 CPU devices launched two ways:
  - meshrun:  meshrun run -n 2 --devices-per-proc 2 bench/startup_job.py
  - by hand:  two python processes with explicit jax.distributed arguments
and reports the median wall time of each and their ratio (goal: <= 1.10).

    python bench/startup.py [--rounds 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import free_port, publish

HERE = Path(__file__).resolve().parent
JOB = HERE / "startup_job.py"
MESHRUN = Path(sys.executable).parent / "meshrun"


def by_hand() -> float:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "PYTHONUNBUFFERED": "1"}
    addr = f"127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen([sys.executable, str(JOB), "--coordinator", addr, "--nprocs", "2", "--rank", str(r)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for r in range(2)
    ]
    codes = [p.wait(timeout=300) for p in procs]
    elapsed = time.perf_counter() - t0
    assert codes == [0, 0], f"hand launch failed: {codes}"
    return elapsed


def with_meshrun(runs: Path, i: int) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(MESHRUN), "run", "-n", "2", "--devices-per-proc", "2", "--platform", "cpu", "--tee", "none", "--runs-dir", str(runs), "--name", f"s{i}", str(JOB)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    hand, mesh = [], []
    with tempfile.TemporaryDirectory() as tmp:
        by_hand()  # warm the page cache for both
        for i in range(args.rounds):
            # Alternate the order so drift on a noisy machine hits both.
            if i % 2:
                hand.append(by_hand())
                mesh.append(with_meshrun(Path(tmp), i))
            else:
                mesh.append(with_meshrun(Path(tmp), i))
                hand.append(by_hand())
    result = {
        "rounds": args.rounds,
        "hand_median_s": statistics.median(hand),
        "meshrun_median_s": statistics.median(mesh),
        "ratio_of_medians": statistics.median(mesh) / statistics.median(hand),
        "median_of_pair_ratios": statistics.median(m / h for m, h in zip(mesh, hand)),
        "hand_s": hand,
        "meshrun_s": mesh,
    }
    publish(
        f"startup, 2 processes x 2 CPU devices, 10 jitted steps, {args.rounds} rounds each",
        ("launch", "median wall (s)"),
        [("by hand, explicit jax.distributed arguments", f"{result['hand_median_s']:.2f}"), ("meshrun run", f"{result['meshrun_median_s']:.2f}")],
        f"ratio meshrun / by hand: {result['ratio_of_medians']:.3f} (median of per-round ratios {result['median_of_pair_ratios']:.3f})",
        result,
        args.json,
    )

if __name__ == "__main__":
    main()
