"""Profile captures a worker takes when the controller asks (``meshrun
profile``, ``--profile-steps``, ``--profile-stragglers``): a
``jax.profiler`` trace from one report to another, written into the host's
scratch folder and sent to the controller over the control connection (the
run folder may be on another machine)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from meshrun import _native
from meshrun._native import ENV

# (capture, the step to stop at, folder) while a trace runs.
_active: tuple[str, int, Path] | None = None


def at_report(client: Any, step: int) -> None:
    """Called at each report, a step boundary: starts a trace the
    controller asked for, or stops the running one at the first report of
    its last step or later (steps, not reports: a program that reports
    every 10 steps traces 10, not 30)."""
    global _active
    if _active is not None:
        _, until, _ = _active
        if step < until:
            return
        finish(client)
        return
    asked = client.take_profile_request(step)
    if asked is None:
        return
    capture, steps = asked
    folder = _folder(capture)
    try:
        import jax

        jax.profiler.start_trace(str(folder))
    except Exception as exc:  # the profiler's own errors are RuntimeError, ValueError, ...
        client.profile_failed(capture, f"jax.profiler.start_trace failed: {type(exc).__name__}: {exc}")
        return
    _active = (capture, step + max(1, steps), folder)


def finish(client: Any) -> None:
    """Stops a running trace and sends it (also when the program ends
    before the trace's last step)."""
    global _active
    if _active is None:
        return
    capture, _, folder = _active
    _active = None
    try:
        import jax

        jax.profiler.stop_trace()
    except Exception as exc:
        client.profile_failed(capture, f"jax.profiler.stop_trace failed: {type(exc).__name__}: {exc}")
        return
    client.send_profile(capture, str(folder))


def _folder(capture: str) -> Path:
    """In the run's scratch folder on this host (removed with the run),
    else a temporary folder."""
    scratch = os.environ.get(ENV["scratch"])
    if scratch:
        folder = _native.profile_folder(scratch, capture, int(os.environ.get(ENV["rank"], "0")))
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    return Path(tempfile.mkdtemp(prefix=f"meshrun-profile-{capture}-"))
