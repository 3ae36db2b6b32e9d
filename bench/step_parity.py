"""Step-time parity: the demo GPT under ``meshrun run`` against the same
script launched by hand with explicit ``jax.distributed`` arguments,
alternately, in one run. Reports the median step time of each (steps after
the first few, which compile) and parity = by-hand / meshrun (goal >= 0.98).
meshrun runs on a pseudo-terminal, so its live progress bar is drawn (and
rank 0's output printed above it) as on a user's terminal; ``--no-bar``
runs it without one (``--quiet``, output to /dev/null). Straggler
measurement is on, as in every run: the figures count the lines of
``lag.jsonl`` each meshrun run wrote (one per step every rank reported).

    python bench/step_parity.py [--rounds 3] [--steps 60] [--no-bar] [--json OUT]
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import json
import os
import pty
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
from pathlib import Path

from common import free_port, publish

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "examples" / "gpt.py"
MESHRUN = Path(sys.executable).parent / "meshrun"
WARMUP = 5


def gpt_args(steps: int, out: Path, data: Path) -> list[str]:
    return [str(GPT), "--fsdp", "2", "--tensor", "2", "--steps", str(steps), "--eval-every", "100000", "--eval-batches", "1", "--step-times", str(out), "--data-dir", str(data)]


def by_hand(steps: int, tmp: Path, i: int) -> list[float]:
    out = tmp / f"hand-{i}.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "PYTHONUNBUFFERED": "1"}
    addr = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen([sys.executable, *gpt_args(steps, out, tmp / "data"), "--coordinator", addr, "--num-processes", "2", "--process-id", str(r)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for r in range(2)
    ]
    assert [p.wait(timeout=900) for p in procs] == [0, 0]
    return json.loads(out.read_text())[WARMUP:]


def on_terminal(cmd: list[str]) -> tuple[int, str]:
    """Runs ``cmd`` with stdout and stderr on a 160-column pseudo-terminal;
    returns its exit status and everything it drew."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    drawn = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not chunk:
            break
        drawn.extend(chunk)
    os.close(master)
    return proc.wait(timeout=900), drawn.decode(errors="replace")


BAR_REDRAWS: list[int] = []
LAG_LINES: list[int] = []


def with_meshrun(steps: int, tmp: Path, i: int, bar: bool = True) -> list[float]:
    out = tmp / f"meshrun-{i}.json"
    cmd = [str(MESHRUN), "run", "-n", "2", "--devices-per-proc", "2", "--platform", "cpu", "--runs-dir", str(tmp / "runs"), "--name", f"p{i}"]
    if bar:
        code, drawn = on_terminal([*cmd, *gpt_args(steps, out, tmp / "data")])
        assert code == 0, drawn[-3000:]
        # Each redraw of the bar rewrites the line that names the attempt.
        BAR_REDRAWS.append(drawn.count("attempt 1 · step"))
    else:
        proc = subprocess.run(
            [*cmd, "--quiet", "--tee", "none", *gpt_args(steps, out, tmp / "data")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900,
        )
        assert proc.returncode == 0, proc.stderr
    lag = tmp / "runs" / f"p{i}" / "lag.jsonl"
    LAG_LINES.append(len(lag.read_text().splitlines()) if lag.exists() else 0)
    return json.loads(out.read_text())[WARMUP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--no-bar", dest="bar", action="store_false")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    hand: list[float] = []
    mesh: list[float] = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for i in range(args.rounds):
            runs = [(hand, by_hand), (mesh, functools.partial(with_meshrun, bar=args.bar))]
            for store, run in runs if i % 2 else reversed(runs):
                store.extend(run(args.steps, tmp, i))
    result = {
        "rounds": args.rounds,
        "steps_per_run": args.steps,
        "hand_median_step_s": statistics.median(hand),
        "meshrun_median_step_s": statistics.median(mesh),
        "parity": statistics.median(hand) / statistics.median(mesh),
        "progress_bar": args.bar,
        "bar_redraws_per_run": BAR_REDRAWS,
        # Straggler measurement was on: every step's arrivals reached the
        # controller (steps + the validation report of step 0).
        "lag_lines_per_run": LAG_LINES,
    }
    publish(
        f"step parity, demo GPT (2 processes x 2 CPU devices, fsdp=2 tensor=2), {args.rounds} runs each, steps {WARMUP + 1}..{args.steps}",
        ("launch", "median step (s)"),
        [("by hand, explicit jax.distributed arguments", f"{result['hand_median_step_s']:.4f}"), ("meshrun run" + (" (progress bar on a terminal)" if args.bar else " --quiet"), f"{result['meshrun_median_step_s']:.4f}")],
        f"parity (by hand / meshrun): {result['parity']:.3f}; straggler measurement on: lag.jsonl lines per meshrun run {LAG_LINES}",
        result,
        args.json,
    )

if __name__ == "__main__":
    main()
