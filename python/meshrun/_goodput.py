"""Where this worker's time goes: the figures behind a run's goodput.

Measured on the main thread, without a barrier: JAX compile spans (trace,
lowering, backend compile; merged so nested spans count once), the join of
``jax.distributed``, waits in ``meshrun.data.Loader``, time blocked in
checkpoint saves and in restores, and when the process and the user's
code started. The controller turns them into parts of the wall time (see
the Rust ``meshrun_record::goodput`` module, whose ``Timing`` takes these
figures by name: a key renamed here is an error there, not a zero).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)

_totals = {"init": 0.0, "data": 0.0, "checkpoint": 0.0, "restore": 0.0}
_user_start = 0.0
_last_sent = 0.0
# Disjoint compile spans (start, end), and their total length.
_spans: list[tuple[float, float]] = []
_compile = 0.0


def _process_start() -> float:
    """The process's start (unix seconds), from /proc: it includes the
    interpreter's own start-up, which no code of ours sees."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


_proc_start = _process_start()


def handed_over() -> None:
    """A warm spare took over an attempt: the attempt's process starts
    now, not when the spare did."""
    global _proc_start
    _proc_start = time.time()


def user_code_starts() -> None:
    global _user_start
    _user_start = time.time()


@contextmanager
def timed(part: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _totals[part] += time.perf_counter() - t0


def counts_as(part: str) -> Callable[[F], F]:
    """Decorator: the function's time counts as ``part``."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _totals[part] += time.perf_counter() - t0

        return inner  # type: ignore[return-value]

    return wrap


def compile_span(start_time: float, end_time: float) -> None:
    """Counts as compiling what replaced it: loading a travelling
    executable (unix seconds)."""
    _compile_span(COMPILE_EVENTS[-1], start_time, end_time)


def _compile_span(event: str, start_time: float, end_time: float, **_: Any) -> None:
    """Adds a compile span, merging it with the spans it overlaps (an outer
    trace is reported after the inner ones it contains). The parameters are
    named as in JAX's listener protocol. Only the main thread's count: a
    program traced again in the background (a travelling executable's
    check) overlaps training."""
    global _compile
    if event not in COMPILE_EVENTS or end_time <= start_time or threading.current_thread() is not threading.main_thread():
        return
    keep = []
    for s, e in _spans:
        if e < start_time or s > end_time:
            keep.append((s, e))
        else:
            start_time, end_time = min(start_time, s), max(end_time, e)
            _compile -= e - s
    keep.append((start_time, end_time))
    _compile += end_time - start_time
    keep.sort()
    _spans[:] = keep


def watch_jax() -> None:
    """Listens to JAX's compile spans and times ``jax.distributed.initialize``
    however it is called (an unmodified script calls it directly)."""
    import jax
    from jax import monitoring

    monitoring.register_event_time_span_listener(_compile_span)
    original = jax.distributed.initialize
    if getattr(original, "_meshrun_timed", False):
        return

    def initialize(*args: Any, **kwargs: Any) -> Any:
        with timed("init"):
            return original(*args, **kwargs)

    initialize._meshrun_timed = True  # type: ignore[attr-defined]
    initialize.__doc__ = original.__doc__
    jax.distributed.initialize = initialize


def snapshot() -> dict[str, float]:
    return {"proc_start": _proc_start, "user_start": _user_start, "now": time.time(), "compile": _compile, **_totals}


def due(saving: bool) -> dict[str, float] | None:
    """The figures when they should go with this report: with every save (a
    failed attempt keeps what it did up to its newest commit), else at most
    once a second."""
    global _last_sent
    now = time.monotonic()
    if not saving and now - _last_sent < 1.0:
        return None
    _last_sent = now
    return snapshot()
