"""Checkpoint save and restore: meshrun against Orbax, in one run, on one disk.

Runs bench/ckpt_job.py under ``meshrun run -n 2 --devices-per-proc 2``: a
pytree of ``--mib`` MiB (float32, sharded fsdp=2 x tensor=2 over 2 processes
x 2 CPU devices), saved and restored ``--rounds`` times by each (see the job
for what each figure times). Around it, the disk's own durable write
bandwidth is measured with ``dd if=/dev/zero bs=16M conv=fsync`` of the same
size into the same folder (median of 3, before and after): a commit is
durable only once its files are synced, so that is the physical limit of a
save. (Orbax does not sync its files; meshrun's save figure includes the
sync of every file and folder.)

    python bench/ckpt.py [--mib 1024] [--rounds 3] [--dir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import publish

HERE = Path(__file__).resolve().parent
MESHRUN = Path(sys.executable).parent / "meshrun"


def dd_bandwidth(folder: Path, mib: int) -> float:
    """Bytes per second of a synced sequential write of ``mib`` MiB."""
    target = folder / "dd.bin"
    count = max(1, mib // 16)
    t0 = time.perf_counter()
    proc = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=16M", f"count={count}", "conv=fsync"], capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - t0
    target.unlink()
    # dd's own figure excludes process start; use it when it parses.
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", proc.stderr)
    return int(m.group(1)) / float(m.group(2)) if m else count * (16 << 20) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--leaves", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where the checkpoints go (default: a temporary folder under bench/out)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = args.dir or HERE / "out"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="ckpt-") as tmp:
        folder = Path(tmp)
        dd = [dd_bandwidth(folder, args.mib) for _ in range(3)]
        out = folder / "job.json"
        cmd = [str(MESHRUN), "run", "-n", "2", "--devices-per-proc", "2", "--platform", "cpu", "--tee", "none", "--runs-dir", str(folder / "runs"), "--name", "ckpt"]
        cmd += [str(HERE / "ckpt_job.py"), "--mib", str(args.mib), "--leaves", str(args.leaves), "--rounds", str(args.rounds), "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            sys.exit(f"the benchmark job failed ({proc.returncode}):\n{proc.stderr}")
        dd += [dd_bandwidth(folder, args.mib) for _ in range(3)]
        import json

        job = json.loads(out.read_text())
    gb = job["bytes"] / 1e9
    med = job["median"]
    m, o = med["meshrun"], med["orbax"]
    dd_bw = statistics.median(dd)
    rows = [
        ("pytree", f"{gb:.2f} GB, {job['leaves']} float32 leaves, 2 processes x 2 devices, {job['rounds']} rounds"),
        ("disk, dd conv=fsync", f"{dd_bw / 1e9:.2f} GB/s"),
    ]
    for what, label in (("blocked", "training blocked by save"), ("save", "save until committed"), ("restore", "restore, same layout"), ("reshard", "restore onto fsdp=4")):
        rows.append((f"{label}: meshrun / Orbax", f"{m[what]:.3f} s / {o[what]:.3f} s"))
    rows.append(("fresh-memory touch before a restore: meshrun / Orbax", f"{m['touch']:.3f} s / {o['touch']:.3f} s"))
    rows.append(("save bandwidth: meshrun / Orbax", f"{gb / m['save']:.2f} / {gb / o['save']:.2f} GB/s"))
    result = {
        **job,
        "dd_bytes_per_s": dd,
        "dd_median_bytes_per_s": dd_bw,
        "save_speedup_over_orbax": o["save"] / m["save"],
        "save_fraction_of_dd": job["bytes"] / m["save"] / dd_bw,
        "restore_speedup_over_orbax": o["restore"] / m["restore"],
        "reshard_speedup_over_orbax": o["reshard"] / m["reshard"],
        "blocked_ratio_to_orbax": m["blocked"] / o["blocked"],
        # The same with each tool's touch added back (see the job's docstring).
        "restore_with_touch_speedup_over_orbax": (o["restore"] + o["touch"]) / (m["restore"] + m["touch"]),
    }
    summary = (
        f"save {result['save_speedup_over_orbax']:.2f}x Orbax, {100 * result['save_fraction_of_dd']:.0f}% of dd fsync bandwidth; "
        f"restore {result['restore_speedup_over_orbax']:.2f}x; resharded restore {result['reshard_speedup_over_orbax']:.2f}x; "
        f"blocked {result['blocked_ratio_to_orbax']:.2f}x Orbax's; "
        f"restore with the touch added back {result['restore_with_touch_speedup_over_orbax']:.2f}x"
    )
    publish("Checkpoint: meshrun vs Orbax (medians)", ("measure", "value"), rows, summary, result, args.json)


if __name__ == "__main__":
    main()
