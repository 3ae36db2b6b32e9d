"""``meshrun.report``: record metrics without a barrier and without
blocking the step.

The caller only puts the record on a queue. A background thread turns
values into JSON (``float(x)`` on a ``jax.Array`` waits for the device, which
must not happen in the training loop) and hands the text to the native
client, whose Rust thread sends it to the controller.
"""

from __future__ import annotations

import json
import queue
import threading
import warnings
from collections.abc import Mapping
from typing import Any

_queue: queue.SimpleQueue = queue.SimpleQueue()
_thread: threading.Thread | None = None
_lock = threading.Lock()
_pending = 0
_idle = threading.Condition(_lock)
_warned = False


def _to_json(value: Any) -> Any:
    # Scalars of numpy or JAX: .item(); arrays: .tolist(); anything else: str.
    if getattr(value, "ndim", None) == 0 or getattr(value, "size", None) == 1:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _worker() -> None:
    global _pending
    from meshrun import _runtime

    while True:
        step, metrics = _queue.get()
        try:
            text = json.dumps(metrics, default=_to_json, allow_nan=True)
            client = _runtime.client()
            if client is not None:
                client.report(step, text)
        except Exception as exc:  # a bad record must not kill reporting
            warnings.warn(f"meshrun.report: record dropped: {exc}", RuntimeWarning, stacklevel=1)
        finally:
            with _lock:
                _pending -= 1
                if _pending == 0:
                    _idle.notify_all()


def report(metrics: Mapping[str, Any], *, step: int | None = None) -> None:
    """Records ``metrics`` (rank 0's go to ``metrics.jsonl``). Returns at once.

    ``step`` defaults to ``metrics["step"]`` when present.
    """
    global _thread, _pending, _warned
    from meshrun import _runtime

    if not isinstance(metrics, Mapping):
        raise TypeError(f"meshrun.report expects a dict of metrics, got {type(metrics).__name__}")
    if _runtime.client() is None:
        if not _warned:
            _warned = True
            warnings.warn("meshrun.report: not running under meshrun; metrics are not recorded", RuntimeWarning, stacklevel=2)
        return
    if step is None and isinstance(metrics.get("step"), int):
        step = metrics["step"]
    with _lock:
        _pending += 1
        if _thread is None:
            _thread = threading.Thread(target=_worker, name="meshrun-report", daemon=True)
            _thread.start()
    _queue.put((step, dict(metrics)))


def drain(timeout: float) -> None:
    """Waits until every queued record has been handed to the client."""
    with _lock:
        _idle.wait_for(lambda: _pending == 0, timeout=timeout)
    from meshrun import _runtime

    client = _runtime.client()
    if client is not None:
        client.flush()
