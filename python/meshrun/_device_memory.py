"""What this worker's first device holds, sent with reports at most every
2 s, where the backend counts it (``device.memory_stats()``: GPUs and TPUs;
the CPU backend gives none, and there the worker's host memory, which its
agent reads, is the device's)."""

from __future__ import annotations

import sys
import time

from meshrun import _jax_private, _native

EVERY_S = 2.0

_last = float("-inf")
_counted = True


def at_report(client: _native.WorkerClient) -> None:
    """Sends the device's bytes in use and their peak, when due."""
    global _last, _counted
    now = time.monotonic()
    if not _counted or now - _last < EVERY_S or "jax" not in sys.modules:
        return
    # Never the first to start a backend (before jax.distributed, it
    # would start one of a single process).
    if not _jax_private.backends_are_initialized():
        return
    _last = now
    import jax

    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - a backend without counts, or not started
        stats = None
    if not stats or "bytes_in_use" not in stats:
        _counted = False
        return
    in_use = int(stats["bytes_in_use"])
    client.device_memory(in_use, int(stats.get("peak_bytes_in_use", in_use)))
