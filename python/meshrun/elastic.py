"""What a program needs when its world size changes between attempts.

An elastic run (``meshrun run --hosts MIN:MAX``, ``ScalingConfig(num_workers=
(MIN, MAX))``) keeps its global batch when it loses hosts: each process then
takes a larger slice of it (meshrun's loader does this by itself). When the
larger slice would not fit on a device, the step can go through it in
micro-batches: :func:`micro_batches` says how many, :func:`accumulate`
computes the loss and gradients over them. Both leave the math unchanged:
the mean over equal micro-batches of a mean loss is the whole batch's mean.

``meshrun.get_context()`` says the attempt's size (``world_size``, with
``min_world_size`` and ``max_world_size``) and why it changed
(``previous_world_size``, ``resize_reason``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from meshrun.errors import ConfigError

__all__ = ["accumulate", "micro_batches"]


def micro_batches(global_batch: int, per_device_limit: int, mesh: Mesh | None = None, axes: Sequence[str] = ("data", "fsdp")) -> int:
    """How many micro-batches a step over ``global_batch`` rows takes so
    that no device holds more than ``per_device_limit`` rows at once: the
    fewest that split each device's rows evenly. The batch is split over
    ``axes`` of ``mesh`` (default: every device of the run)."""
    devices = math.prod(mesh.shape[a] for a in axes if a in mesh.shape) if mesh is not None else jax.device_count()
    if per_device_limit < 1:
        raise ConfigError(f"per_device_limit must be at least 1, got {per_device_limit}")
    if global_batch % devices:
        raise ConfigError(f"a global batch of {global_batch} rows does not split over {devices} devices; use a multiple of {devices}")
    rows = global_batch // devices
    return next(n for n in range(1, rows + 1) if rows % n == 0 and rows // n <= per_device_limit)


def accumulate(loss_fn: Callable[..., Any], micro_batches: int) -> Callable[..., tuple[Any, Any]]:
    """``jax.value_and_grad(loss_fn)`` taken over ``micro_batches`` equal
    parts of the batch (``loss_fn(params, batch, *args)``; every leaf of
    ``batch`` has the rows first), one part at a time (``lax.scan``): the
    mean loss and the mean gradient. Part ``i`` holds rows ``i, i + n, i +
    2n, ...``, so each device splits the rows it already holds and nothing
    moves between devices."""
    grad_fn = jax.value_and_grad(loss_fn)
    if micro_batches == 1:
        return grad_fn
    if micro_batches < 1:
        raise ConfigError(f"micro_batches must be at least 1, got {micro_batches}")
    n = micro_batches

    def split(x):
        if x.shape[0] % n:
            raise ConfigError(f"a batch of {x.shape[0]} rows does not split into {n} micro-batches")
        return x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)

    def fn(params, batch, *args):
        def body(carry, part):
            loss_sum, grad_sum = carry
            loss, grads = grad_fn(params, part, *args)
            return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        (loss, grads), _ = jax.lax.scan(body, (jnp.zeros(()), zeros), jax.tree.map(split, batch))
        return loss / n, jax.tree.map(lambda g: g / n, grads)

    return fn
