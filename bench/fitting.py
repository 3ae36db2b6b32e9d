"""The planner's predicted peak per device against the measured one.

Trains examples/gpt.py for 2 steps on each mesh below, unlimited, each run
with a scratch folder of its own (so every process compiles: a warm
compilation cache leaves out the compiler's memory), and sets the peak the
planner printed for the run's mesh beside the peak meshrun measured for
each rank (its cgroup's, what a --memory-per-proc limit counts; the
highest rank's).

    python bench/fitting.py [--sizes medium large] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from common import jsonl, publish

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "examples" / "gpt.py"
MESHRUN = Path(sys.executable).parent / "meshrun"
#: (processes, fsdp): one worker, fsdp=2 x data=2, fsdp=4.
MESHES = [(1, 1), (4, 2), (4, 4)]
GiB = 1 << 30


def run(size: str, nprocs: int, fsdp: int, work: Path, data_dir: str) -> dict:
    name = f"{size}-{nprocs}-{fsdp}"
    scratch = work / f"scratch-{name}"
    cmd = [str(MESHRUN), "run", "--runs-dir", str(work / "runs"), "--name", name, "-n", str(nprocs), "--tee", "none", str(GPT),
           "--size", size, "--fsdp", str(fsdp), "--steps", "2", "--batch-size", "4", "--seq-len", "64",
           "--eval-every", "100000", "--eval-batches", "1", "--data-dir", data_dir]  # fmt: skip
    env = {**os.environ, "MESHRUN_SCRATCH": str(scratch)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    run_dir = work / "runs" / name
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert done.returncode == 0, done.stderr + log[-2000:]
    predicted = int(re.search(r"gpt: predicted peak (\d+) bytes per device", log).group(1))
    ended = [e for e in jsonl(run_dir / "events.jsonl") if e["event"] == "attempt_ended"][-1]
    measured = max(m["peak"] for m in ended["memory"])
    mesh = re.search(r"gpt: (data=\d+ fsdp=\d+ tensor=\d+):", log).group(1)
    return {"size": size, "processes": nprocs, "mesh": mesh, "predicted": predicted, "measured": measured, "error": predicted / measured - 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["medium", "large"])
    parser.add_argument("--meshes", nargs="+", default=[f"{n}:{f}" for n, f in MESHES], help="PROCESSES:FSDP")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshrun-fitting-") as tmp:
        work = Path(tmp)
        data_dir = str(work / "corpus")
        results = []
        for size in args.sizes:
            for mesh in args.meshes:
                nprocs, fsdp = map(int, mesh.split(":"))
                results.append(run(size, nprocs, fsdp, work, data_dir))
                r = results[-1]
                print(f"{size} {r['mesh']}: predicted {r['predicted'] / GiB:.2f} GiB, measured {r['measured'] / GiB:.2f} GiB ({r['error']:+.0%})", flush=True)
    rows = [
        (f"{r['size']}, {r['processes']} process(es), {r['mesh']}", f"{r['predicted'] / GiB:.2f} / {r['measured'] / GiB:.2f} GiB ({r['error']:+.0%})")
        for r in results
    ]
    worst = max(abs(r["error"]) for r in results)
    publish(
        "## The planner's peak per device against the measured one",
        ("GPT, mesh", "predicted / measured peak"),
        rows,
        f"largest error {worst:.0%}",
        {"results": results, "largest_error": worst},
        args.json,
    )


if __name__ == "__main__":
    main()
