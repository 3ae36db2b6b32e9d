"""The cost of a real network path between hosts: the demo GPT (2 hosts x
1 process x 2 CPU devices, fsdp=2 tensor=2) on 2 hosts that share nothing
(network namespaces joined by a bridge, host 1 joining with ``meshrun
join``) against 2 loopback hosts (``--hosts 2`` on one machine),
alternately, in one run. Reports the median step time of each (steps after
the first few, which compile) and their ratio. Needs root (namespaces).

    python bench/hosts.py [--rounds 3] [--steps 60] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import publish

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from nshosts import NsHosts, nshosts_unavailable  # noqa: E402

GPT = ROOT / "examples" / "gpt.py"
MESHRUN = Path(sys.executable).parent / "meshrun"
WARMUP = 5
PORT = 29400


def gpt_args(steps: int, out: Path, data: Path) -> list[str]:
    return [str(GPT), "--fsdp", "2", "--tensor", "2", "--steps", str(steps), "--eval-every", "100000", "--eval-batches", "1", "--step-times", str(out), "--data-dir", str(data)]


def on_loopback(steps: int, tmp: Path, i: int) -> list[float]:
    out = tmp / f"loopback-{i}.json"
    cmd = [str(MESHRUN), "run", "-n", "2", "--hosts", "2", "--devices-per-proc", "2", "--platform", "cpu", "--quiet", "--tee", "none", "--runs-dir", str(tmp / "runs"), "--name", f"loop{i}"]
    proc = subprocess.run([*cmd, *gpt_args(steps, out, tmp / "data")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())[WARMUP:]


def on_namespaces(hosts: NsHosts, steps: int, tmp: Path, i: int) -> list[float]:
    out = hosts.shared / f"ns-{i}.json"
    listen = f"{hosts.addr(0)}:{PORT}"
    env = {"MESHRUN_TOKEN": secrets.token_hex(32)}
    cmd = [str(MESHRUN), "run", "-n", "2", "--hosts", "2", "--listen", listen, "--storage", str(hosts.shared), "--devices-per-proc", "2", "--platform", "cpu", "--quiet", "--tee", "none", "--runs-dir", "/tmp/runs", "--name", f"ns{i}"]
    controller = hosts.popen(0, [*cmd, *gpt_args(steps, out, tmp / "data")], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    joiner = hosts.popen(1, [str(MESHRUN), "join", listen], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = controller.communicate(timeout=900)
    assert controller.returncode == 0, err
    assert joiner.wait(timeout=60) == 0
    return json.loads(out.read_text())[WARMUP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    reason = nshosts_unavailable()
    if reason is not None:
        raise SystemExit(f"bench/hosts.py needs network namespaces: {reason}")
    loop: list[float] = []
    ns: list[float] = []
    with tempfile.TemporaryDirectory() as t, NsHosts(2) as hosts:
        tmp = Path(t)
        for i in range(args.rounds):
            runs = [(loop, lambda i=i: on_loopback(args.steps, tmp, i)), (ns, lambda i=i: on_namespaces(hosts, args.steps, tmp, i))]
            for store, run in runs if i % 2 else reversed(runs):
                store.extend(run())
    result = {
        "rounds": args.rounds,
        "steps_per_run": args.steps,
        "loopback_median_step_s": statistics.median(loop),
        "namespaces_median_step_s": statistics.median(ns),
        "ratio": statistics.median(ns) / statistics.median(loop),
    }
    publish(
        f"demo GPT (2 hosts x 1 process x 2 CPU devices, fsdp=2 tensor=2), {args.rounds} runs each, steps {WARMUP + 1}..{args.steps}",
        ("hosts", "median step (s)"),
        [("2 loopback hosts (--hosts 2, one machine)", f"{result['loopback_median_step_s']:.4f}"), ("2 namespace hosts (own address, /tmp, scratch; meshrun join)", f"{result['namespaces_median_step_s']:.4f}")],
        f"ratio (namespaces / loopback): {result['ratio']:.3f}",
        result,
        args.json,
    )


if __name__ == "__main__":
    main()
