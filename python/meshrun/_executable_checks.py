"""Checks of what a restart loaded instead of tracing (see
:mod:`meshrun._executables`): each traces its function again in a
background thread, once the attempt's first step has run, and compares
the program with the one the stored result was made from.

Until every check is done, durable saves wait (:func:`settle`), and so
does the program's end; memory checkpoints do not (a restart still redoes
at most one step). A mismatch removes the stored file and fails the
attempt at the next call of a travelling function with
``StaleExecutableError``, before any durable save of what it computed; the
controller then restarts from storage, not from the memory checkpoints
that attempt kept (``meshrun_machine``'s ``Run``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from meshrun import _native
from meshrun.errors import StaleExecutableError, StorageError


class Check:
    def __init__(self, what: str, folder: str, key: str, expected: str, program: Callable[[], str], say: Callable[[str], None]) -> None:
        self.what, self.folder, self.key, self.expected, self.program, self.say = what, folder, key, expected, program, say
        self.stale: str | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meshrun-check", daemon=True)
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def _run(self) -> None:
        global _stale
        try:
            seen = self.program()
        except Exception:  # noqa: BLE001
            # Not a verdict: tracing fails in a process whose group is
            # being stopped (a peer died), and a program that cannot be
            # traced fails in its own calls too.
            seen = self.expected
        if seen != self.expected:
            self.stale = (
                f"{self.what} was loaded from an earlier attempt of this run, but this attempt's program traces to another "
                f"(it depends on more than its arguments' shapes: a value in a closure, say); the stored one was removed and "
                f"the next attempt compiles it. Pass meshrun.jit(..., travel=False) to compile it in every attempt"
            )
            with contextlib.suppress(StorageError):  # else the next attempt finds it stale again
                _native.remove_executable(self.folder, self.key)
            self.say(self.stale)
            _stale = self.stale
        self.done.set()


_checks: list[Check] = []
_lock = threading.Lock()
# The first stale verdict: read at every call of a travelling function.
_stale: str | None = None


def add(check: Check) -> None:
    """Queues a check; it starts with :func:`start_all`."""
    with _lock:
        _checks.append(check)


def start_all() -> None:
    with _lock:
        for c in _checks:
            c.start()


def when_computed(output: Any, then: Callable[[], None]) -> None:
    """Calls `then` once `output` (of a first step) is computed, from a
    thread of its own, so that the step runs at full speed first; at once
    when there is no output to wait for."""
    if output is None:
        then()
        return

    def wait_then() -> None:
        # Donated to the next call by then (deleted): computed, as good.
        with contextlib.suppress(Exception):
            output.block_until_ready()
        then()

    threading.Thread(target=wait_then, name="meshrun-first-step", daemon=True).start()


def raise_if_stale() -> None:
    if _stale is not None:
        raise StaleExecutableError(_stale)


def settle() -> None:
    """Waits for every check (starting any not yet started); raises if one
    found a stale result."""
    start_all()
    with _lock:
        pending = list(_checks)
    for c in pending:
        c.done.wait()
    raise_if_stale()
