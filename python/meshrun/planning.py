"""Planning a mesh before launching: which ``(data, fsdp, tensor)`` meshes a
model's training state fits in, and what each device then holds.

Fitting a model is not the division one expects. Sharding the state over
``fsdp`` divides parameters, gradients and optimizer moments, but each
device also holds, while it computes, the weights it gathered from the
others: with the layers unrolled (a Python loop, as most Flax models are)
XLA keeps every gathered layer live from the forward pass to the backward
pass, so a device holds the whole model's parameters (divided by
``tensor`` only) on top of its share. :func:`plan` counts that, the
activations kept for the backward pass, and the runtime itself, and says
what lowers each (docs/fitting.md has the worked example and the measured
peaks it was checked against).

    >>> plans = planning.plan(abstract_params, RULES, "2GiB", optimizer=tx, devices=4)
    >>> best = next(p for p in plans if p.fits)
    >>> print(planning.table(plans))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from meshrun import _native
from meshrun._rules import Rules, path_str, spec_for
from meshrun.errors import ConfigError

__all__ = ["Fit", "bytes_per_device", "parse_size", "plan", "table"]

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10

#: The share of the memory a plan may fill.
HEADROOM = 0.9


def parse_size(size: int | str) -> int:
    """Bytes from an int or text such as ``"2GiB"``, ``"1500MiB"``, ``"3.5GB"``,
    read as ``--memory-per-proc`` reads them (the ``i`` units are powers of
    1024)."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size <= 0:
            raise ConfigError(f"a memory size must be positive, got {size}")
        return size
    try:
        value = _native.parse_size(str(size))
    except ConfigError as e:
        # The engine's words after its own "cannot read '...' as a size: ".
        why = str(e).split(": ", 1)[-1]
        raise ConfigError(f"cannot read {size!r} as a memory size: {why}") from None
    if value <= 0:
        raise ConfigError(f"a memory size must be positive, got {size!r}")
    return value


def _size_text(n: int) -> str:
    """``n`` bytes in the largest unit it reaches, to a tenth where that is
    under 100 (3.1 MiB, 150 KiB, 579 MiB, 1.13 GiB): a small model's terms,
    rounded to whole MiB, would read as 0 and stop adding up to its peak.
    A whole number drops its ``.0`` (96 MiB)."""
    if n == 0:
        return "0 MiB"
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    for unit, name in ((MiB, "MiB"), (KiB, "KiB")):
        if n >= unit:
            figure = f"{n / unit:.0f}" if n >= 100 * unit else f"{n / unit:.1f}".removesuffix(".0")
            return f"{figure} {name}"
    return f"{n} B"


@dataclass(frozen=True)
class Fit:
    """One mesh and what each of its devices holds at the peak of a step
    (bytes). ``grads``: the gradients' shards; ``updates``: what the
    optimizer's update builds before the old values are freed (about one
    more copy of the gradients' shards, with the state donated);
    ``gathered``: weights gathered from the other ``fsdp`` shards and kept
    from the forward to the backward pass; ``runtime``: what the process
    holds before the state (the interpreter and JAX), per device. A mesh
    fits when its peak is within ``HEADROOM`` of the memory: allocators
    fragment, and counts miss things."""

    data: int
    fsdp: int
    tensor: int
    params: int
    opt: int
    grads: int
    updates: int
    gathered: int
    activations: int
    runtime: int
    memory: int
    layers: int = 0

    @property
    def mesh(self) -> str:
        return f"data={self.data} fsdp={self.fsdp} tensor={self.tensor}"

    @property
    def state(self) -> int:
        """Parameters and optimizer state per device: what a checkpoint holds."""
        return self.params + self.opt

    @property
    def peak(self) -> int:
        """The predicted peak per device."""
        return self.params + self.opt + self.grads + self.updates + self.gathered + self.activations + self.runtime

    @property
    def fits(self) -> bool:
        return self.peak <= self.memory * HEADROOM

    def lowered_by(self) -> list[str]:
        """What would lower the peak, largest saving first; a change that
        would save nothing here is left out."""
        scan = self.gathered - self.gathered // self.layers if self.layers > 1 else 0
        remat = self.activations * 3 // 4
        opt = self.opt // 2
        ways = [
            (scan, "scan the layers (jax.lax.scan or nnx.scan over stacked blocks): one layer's gathered weights live at a time, "
                   f"lowering the peak by {_size_text(scan)}"),
            (remat, "rematerialise each block (jax.checkpoint, nnx.remat): the backward pass recomputes its activations, "
                    f"lowering the peak by about {_size_text(remat)}"),
            (opt, "shard the optimizer state further (a larger fsdp) or keep its moments in bfloat16: "
                  f"lowering the peak by up to {_size_text(opt)}"),
        ]  # fmt: skip
        return [text for saved, text in sorted(ways, reverse=True) if saved > 0]

    def __str__(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        return (
            f"{self.mesh}: state {_size_text(self.state)} per device (params {_size_text(self.params)}, opt {_size_text(self.opt)}); "
            f"predicted peak {_size_text(self.peak)} of {_size_text(self.memory)} ({verdict})"
        )


def _leaves(tree: Any, rules: Rules | None, default: P) -> list[tuple[tuple[int, ...], int, P]]:
    """(shape, itemsize, spec) per leaf: the rules' spec, else the leaf's own
    sharding's (shape structs from ``describe``), else ``default``."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = tuple(getattr(leaf, "shape", ()))
        itemsize = np.dtype(getattr(leaf, "dtype", np.float32)).itemsize
        own = getattr(getattr(leaf, "sharding", None), "spec", default)
        spec = spec_for(path_str(path), rules, default) if rules is not None else own
        out.append((shape, itemsize, spec))
    return out


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def bytes_per_device(leaves: Sequence[tuple[tuple[int, ...], int, P]], sizes: dict[str, int], *, drop: str | None = None) -> int | None:
    """Bytes each device holds of ``leaves`` on a mesh of ``sizes``, or None
    where a dimension does not divide by its axes (meshrun's sharding
    refuses such a layout). ``drop``: an axis taken as unsharded (the
    weights a device gathers over ``fsdp``)."""
    total = 0
    for shape, itemsize, spec in leaves:
        elements = 1
        for i, dim in enumerate(shape):
            entry = spec[i] if i < len(spec) else None
            ways = math.prod(sizes[a] for a in _axes(entry) if a != drop)
            if dim % ways:
                return None
            elements *= dim // ways
        total += elements * itemsize
    return total


def _meshes(devices: int) -> list[dict[str, int]]:
    out = []
    for tensor in range(1, devices + 1):
        if devices % tensor:
            continue
        for fsdp in range(1, devices // tensor + 1):
            if (devices // tensor) % fsdp == 0:
                out.append({"data": devices // tensor // fsdp, "fsdp": fsdp, "tensor": tensor})
    # Least communication first: data parallelism exchanges gradients once a
    # step; fsdp also gathers every weight in the forward and backward
    # passes; tensor parallelism exchanges activations in every layer.
    return sorted(out, key=lambda s: (s["tensor"], s["fsdp"]))


def plan(
    params: Any,
    rules: Rules | None,
    memory: int | str,
    *,
    optimizer: Any = None,
    opt_state: Any = None,
    devices: int | None = None,
    global_batch: int = 0,
    activations_per_example: int = 0,
    runtime: int = 0,
    layers: int = 0,
    default: P = P(),
) -> list[Fit]:
    """Every ``(data, fsdp, tensor)`` mesh of ``devices`` (default: the run's)
    on which the rules lay the state out, ordered by least communication,
    each with its bytes per device and predicted peak against ``memory``
    (bytes per device, or a size such as ``"2GiB"``).

    ``params``: the parameters, or their shapes (``jax.eval_shape``);
    ``optimizer``: an optax transformation whose state is counted (or
    ``opt_state``, its shapes); gradients count as one more copy of the
    parameters' shards. ``global_batch`` and ``activations_per_example``:
    the bytes a device keeps for the backward pass, divided over
    ``data`` x ``fsdp``. ``runtime``: bytes per device held before the state
    (on CPU, the process's resident set over its devices). ``layers``: how
    many blocks the gathered weights are spread over (for the advice)."""
    budget = parse_size(memory)
    n = devices if devices is not None else jax.device_count()
    if opt_state is None and optimizer is not None:
        opt_state = jax.eval_shape(optimizer.init, params)
    p_leaves = _leaves(params, rules, default)
    o_leaves = _leaves(opt_state, rules, default) if opt_state is not None else []
    fits = []
    for sizes in _meshes(n):
        p = bytes_per_device(p_leaves, sizes)
        o = bytes_per_device(o_leaves, sizes)
        whole = bytes_per_device(p_leaves, sizes, drop="fsdp")
        if p is None or o is None or whole is None:
            continue
        shards = sizes["data"] * sizes["fsdp"]
        fits.append(
            Fit(
                **sizes,
                params=p,
                opt=o,
                grads=p,
                updates=p if o_leaves else 0,
                gathered=whole - p if sizes["fsdp"] > 1 else 0,
                activations=activations_per_example * -(-global_batch // shards) if global_batch else 0,
                runtime=runtime,
                memory=budget,
                layers=layers,
            )
        )
    return fits


def table(plans: Sequence[Fit]) -> str:
    """The plans as a table, in their order."""
    head = ("mesh", "params", "opt", "grads", "updates", "gathered", "activations", "runtime", "peak", "fits")
    rows = [
        (
            f.mesh,
            *(_size_text(b) for b in (f.params, f.opt, f.grads, f.updates, f.gathered, f.activations, f.runtime, f.peak)),
            "yes" if f.fits else "no",
        )
        for f in plans
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows])


def what_fits(state: Any, memory: int, devices: int, current: dict[str, int], runtime: int = 0) -> str:
    """For an out-of-memory summary: the first mesh (by least communication)
    other than ``current`` whose predicted peak fits ``memory``, on these
    ``devices`` or else on 2, 4, ... 64 times as many, in words. ``state``:
    ``{"params": ..., "opt": ...}`` with shardings (as described);
    ``runtime``: what the process holds besides (activations are not known
    here)."""
    if isinstance(state, dict) and "params" in state:
        params, opt = state["params"], {k: v for k, v in state.items() if k != "params"}
    else:
        params, opt = state, None
    now = (current.get("data"), current.get("fsdp"), current.get("tensor"))
    for times in (1, 2, 4, 8, 16, 32, 64):
        try:
            plans = plan(params, None, memory, opt_state=opt, devices=devices * times, runtime=runtime)
        except Exception:  # noqa: BLE001 - advice only; never fails the describe
            return ""
        for f in plans:
            if f.fits and (times > 1 or (f.data, f.fsdp, f.tensor) != now):
                where = f"with {f.mesh}" if times == 1 else f"on {devices * times} devices, with {f.mesh},"
                return f"{where} the state is {_size_text(f.state)} per device (predicted peak {_size_text(f.peak)} before activations)"
    return f"no mesh of up to {devices * 64} devices fits {_size_text(memory)} per device: a smaller model or optimizer state"
