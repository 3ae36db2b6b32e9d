"""examples/gpt.py with a pause before each report (GPT_PACE_S seconds,
default 0.3), so that a test can lose and bring back hosts while it trains;
with GPT_PACE_RANKS (comma-separated) only those ranks pause, and are the
run's stragglers. Everything else is the example's own: its arguments, data
and math."""

import os
import runpy
import sys
import time
from pathlib import Path

import meshrun

GPT = Path(__file__).resolve().parents[2] / "examples" / "gpt.py"
PACE = float(os.environ.get("GPT_PACE_S", "0.3"))
RANKS = os.environ.get("GPT_PACE_RANKS")
if RANKS and os.environ.get("MESHRUN_RANK") not in RANKS.split(","):
    PACE = 0.0
_report = meshrun.report


def paced(*args, **kwargs):
    if PACE:
        time.sleep(PACE)
    return _report(*args, **kwargs)


meshrun.report = paced
sys.argv = [str(GPT), *sys.argv[1:]]
runpy.run_path(str(GPT), run_name="__main__")
