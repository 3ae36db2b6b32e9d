"""``--memory-per-proc`` on CUDA: the limit is on the worker's GPU, where
XLA's allocator takes its memory, not on the host. XLA is told before its
backend starts, in the bootstrap: ``XLA_PYTHON_CLIENT_MEM_FRACTION`` is the
limit over the GPU's size (read with ``nvidia-smi`` for the worker's own
GPU), and ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` so that the worker takes
what it uses, up to that share, rather than all of it at start (what
``memory_stats()`` then shows is what the program needs). A program's own
settings of either are kept."""

from __future__ import annotations

import os
import shutil
import subprocess

from meshrun._native import ENV

FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"


def gpu_bytes(gpu: str) -> int | None:
    """The memory of physical GPU ``gpu`` (its index), or None where
    ``nvidia-smi`` cannot say."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        query = [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", gpu]
        out = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True)
        return int(out.stdout.split()[0]) << 20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def fraction(limit: int, total: int) -> str:
    """The share of a GPU of ``total`` bytes that is ``limit`` bytes, as XLA
    reads it (at most all of it)."""
    return f"{min(limit / total, 1.0):.4f}"


def apply() -> str | None:
    """Sets XLA's share of this worker's GPU from its limit; returns what
    was set, or why nothing was, for the worker's log."""
    limit = os.environ.get(ENV["memory_per_proc"])
    if not limit or os.environ.get("JAX_PLATFORMS") != "cuda":
        return None
    os.environ.setdefault(PREALLOCATE, "false")
    if FRACTION in os.environ:
        return f"meshrun: {FRACTION}={os.environ[FRACTION]} set by the program is kept (--memory-per-proc {limit} bytes)"
    gpus = os.environ.get(ENV["gpus"], "").split(",")
    total = gpu_bytes(gpus[0]) if gpus and gpus[0] else None
    if total is None:
        return f"meshrun: the size of GPU {gpus[0] or '?'} could not be read (nvidia-smi); --memory-per-proc is not set in XLA"
    os.environ[FRACTION] = fraction(int(limit), total)
    return None
