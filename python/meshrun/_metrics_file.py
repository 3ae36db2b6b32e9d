"""``--metrics-file``: the steps of a program that never calls
``meshrun.report``, read from the JSON-lines metrics file it writes anyway
(MaxText's ``metrics_file``: one object a step, ``{"step": 3,
"learning/loss": 9.1, ...}``).

Rank 0 follows the file from a thread and sends each complete line as a
report of its step, so the progress line, ``meshrun status``, the report and
``--hang-timeout`` see the program's steps. Only what is written after the
worker started counts: a file left by an earlier attempt or run was already
reported, or is not this run's. A file that was started anew (MaxText
truncates it at step 0: it shrinks, or its first bytes change) is read from
its beginning. Each step is reported once, from its first line: every
process of the program may append its own (MaxText's do).
"""

from __future__ import annotations

import json
import numbers
import os
import sys
import threading
from typing import Any

from meshrun import _connection
from meshrun._native import ENV

# How often the file is looked at: a step is seen at most this late.
_POLL_S = 0.5
# The first bytes of the file, kept to tell a file written anew.
_HEAD = 256

_follower: _Follower | None = None


class _Follower:
    def __init__(self, path: str) -> None:
        self.path = path
        self.offset, self.head = 0, b""
        try:
            with open(path, "rb") as f:
                self.head = f.read(_HEAD)
                self.offset = f.seek(0, os.SEEK_END)
        except OSError:
            pass
        self.partial = b""
        self.bad_lines = 0
        # Every process of a program may append its own line for a step
        # to the same file (MaxText's do): a step is reported once, from
        # its first line.
        self.last_step: int | None = None
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="meshrun-metrics-file", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(_POLL_S):
            self.read()

    def read(self) -> None:
        """Reports every complete line written since the last read."""
        with self.lock:
            try:
                size = os.path.getsize(self.path)
            except OSError:
                return  # not written yet
            with open(self.path, "rb") as f:
                head = f.read(_HEAD)
                if size < self.offset or head[: len(self.head)] != self.head:
                    self.offset, self.partial = 0, b""
                self.head = head
                if size == self.offset:
                    return
                f.seek(self.offset)
                data = f.read(size - self.offset)
            self.offset += len(data)
            *lines, self.partial = (self.partial + data).split(b"\n")
            for line in lines:
                self._report(line)

    def _report(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            record = json.loads(line)
            step = record["step"]
            if isinstance(step, float) and step.is_integer():
                step = int(step)
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                raise ValueError(f"step {step!r} is not a non-negative integer")
        except (ValueError, KeyError, TypeError) as exc:
            self.bad_lines += 1
            if self.bad_lines == 1:
                sys.stderr.write(
                    f"meshrun: warning: --metrics-file {self.path}: a line that is not a JSON object with a "
                    f"non-negative integer 'step' was skipped ({type(exc).__name__}: {exc}): {line[:200]!r}\n"
                )
                sys.stderr.flush()
            return
        if self.last_step is not None and step <= self.last_step:
            return
        self.last_step = step
        client = _connection.client()
        if client is None:
            return
        metrics: dict[str, Any] = {
            k: float(v) for k, v in record.items() if k != "step" and isinstance(v, numbers.Real) and not isinstance(v, bool)
        }
        client.report(step, metrics, False, None, False, None)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()
        self.read()
        if self.partial.strip():
            self._report(self.partial)
            self.partial = b""


def follow() -> None:
    """Starts following the run's metrics file on rank 0, if the run names one."""
    global _follower
    path = os.environ.get(ENV["metrics_file"])
    if not path or os.environ.get(ENV["rank"]) != "0" or _follower is not None:
        return
    _follower = _Follower(path)


def finish() -> None:
    """Reports what the program wrote last, before the worker's connection closes."""
    global _follower
    if _follower is not None:
        follower, _follower = _follower, None
        follower.finish()
