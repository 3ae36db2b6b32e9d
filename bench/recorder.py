"""The flight recorder's cost: the demo GPT's step time under ``meshrun
run`` with the recorder on (the default) and off (``MESHRUN_RECORDER=0``),
alternately, in one run. Reports the median step time of each (steps after
the first few, which compile) and their ratio (goal: on / off <= 1.01).

    python bench/recorder.py [--rounds 3] [--steps 60] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from common import publish
from step_parity import WARMUP, with_meshrun


def run(recorder: bool, steps: int, tmp: Path, i: int) -> list[float]:
    os.environ["MESHRUN_RECORDER"] = "1" if recorder else "0"
    try:
        return with_meshrun(steps, tmp, i, bar=False)
    finally:
        del os.environ["MESHRUN_RECORDER"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    steps: dict[bool, list[float]] = {True: [], False: []}
    medians: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for i in range(args.rounds):
            for recorder in (True, False) if i % 2 else (False, True):
                times = run(recorder, args.steps, tmp, 2 * i + recorder)
                steps[recorder].extend(times)
                medians[recorder].append(statistics.median(times))
    on, off = statistics.median(steps[True]), statistics.median(steps[False])
    result = {
        "rounds": args.rounds,
        "steps_per_run": args.steps,
        "on_median_step_s": on,
        "off_median_step_s": off,
        "on_run_medians_s": medians[True],
        "off_run_medians_s": medians[False],
        "ratio_on_off": on / off,
    }
    publish(
        f"flight recorder, demo GPT (2 processes x 2 CPU devices, fsdp=2 tensor=2), {args.rounds} runs each, steps {WARMUP + 1}..{args.steps}",
        ("recorder", "median step (s)"),
        [("on (the default)", f"{on:.4f}"), ("off (MESHRUN_RECORDER=0)", f"{off:.4f}")],
        f"on / off: {on / off:.3f} (run medians on {[round(m, 4) for m in medians[True]]}, off {[round(m, 4) for m in medians[False]]})",
        result,
        args.json,
    )


if __name__ == "__main__":
    main()
