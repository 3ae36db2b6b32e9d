"""``meshrun.Trainer(...).fit()`` from a user's program with this venv's JAX."""

from __future__ import annotations

import json
import subprocess
import sys

from cellrun import PROGRAMS, fresh_env, kill_left


def test_trainer_fit(tmp_path):
    runs = tmp_path / "runs"
    try:
        done = subprocess.run([sys.executable, str(PROGRAMS / "fit.py"), str(runs)], capture_output=True, text=True, timeout=240, env=fresh_env(tmp_path), cwd=tmp_path)
    finally:
        left = kill_left(runs / "fit")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not left, f"processes left behind: {left}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"error": None, "status": "succeeded", "metrics": {"step": 2, "sum": 9, "world": 2, "devices": 4}, "path": str(runs / "fit")}
