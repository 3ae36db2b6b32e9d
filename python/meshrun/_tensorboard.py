"""``python -m meshrun._tensorboard RUN_DIR OFFSET``: started by the
controller of a run with ``--tensorboard``. Follows the run's
``metrics.jsonl`` from byte OFFSET (read through the run folder's Rust
types) and writes every numeric metric as a
TensorBoard scalar (tensorboardX) under ``RUN_DIR/tensorboard``, so
``tensorboard --logdir runs`` shows every run by name. Being a process of
its own, it costs the training loop nothing. On SIGTERM (the run ended) it
writes what is left and exits.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from meshrun import _native


def scalars(metrics: dict[str, Any], prefix: str = "") -> list[tuple[str, float]]:
    """Numeric values by name; nested dicts become ``outer/inner``."""
    out = []
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.extend(scalars(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
            out.append((name, float(value)))
    return out


def main(argv: list[str]) -> None:
    run_dir, offset = argv[0], int(argv[1])
    from tensorboardX import SummaryWriter

    stopping = False

    def on_term(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    writer = SummaryWriter(logdir=os.path.join(run_dir, "tensorboard"), flush_secs=2)
    while True:
        last_pass = stopping
        records, offset = _native.read_metrics(run_dir, offset)
        for record in records:
            step = record.get("step")
            for name, value in scalars(record.get("metrics") or {}):
                writer.add_scalar(name, value, global_step=step, walltime=record.get("time"))
        if last_pass:
            break
        time.sleep(0.5)
    writer.close()


if __name__ == "__main__":
    main(sys.argv[1:])
