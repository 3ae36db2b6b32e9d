"""Sharding helpers: FSDP and tensor parallelism as easy as data parallelism.

- :func:`make_mesh` lays a ``(data, fsdp, tensor)`` mesh over every device
  of every process, with the axes that exchange the most placed closest:
  ``tensor`` varies fastest (neighbouring devices, same process, same host),
  then ``fsdp``, then ``data`` (across hosts). Devices are ordered by
  process, and processes host by host, so an axis group stays within one
  host whenever its size fits there.
- Rules map parameter paths to ``PartitionSpec`` s: an ordered list of
  ``(regex, spec)``, first match wins (``re.search`` on the path, such as
  ``blocks/0/attn/q/kernel``), else ``default``. Optimizer state built by
  optax mirrors the parameter tree under a prefix (``0/mu/blocks/0/...``),
  so the same rules give each moment the sharding of its parameter.
- :func:`shardings_for`, :func:`shard`, :func:`init_sharded` apply rules;
  :func:`global_batch` turns per-process numpy batches into global arrays;
  :func:`describe` tabulates what each device holds.

Works with plain pytrees and with Flax NNX state (``nnx.split``/``nnx.state``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from meshrun import _connection, planning
from meshrun._native import ENV
from meshrun._rules import Rules, path_str as _path_str, spec_for
from meshrun.errors import ConfigError

__all__ = [
    "AXES",
    "Description",
    "P",
    "Row",
    "Rules",
    "describe",
    "global_batch",
    "init_sharded",
    "make_mesh",
    "shard",
    "shardings_for",
    "spec_for",
]

#: Mesh axes in order, slowest-varying first: ``data`` spans hosts, ``tensor``
#: stays within a process where it can.
AXES = ("data", "fsdp", "tensor")


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, *, devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh over every device of the run (or ``devices``); one size may be -1."""
    devices = list(devices if devices is not None else jax.devices())
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    n = len(devices)
    layout = f"{jax.process_count()} process(es) x {jax.local_device_count()} device(s)"
    unknown = [a for a, s in sizes.items() if s == -1]
    for axis, size in sizes.items():
        if not isinstance(size, int) or (size < 1 and size != -1):
            raise ConfigError(f"mesh axis {axis}={size!r} must be a positive integer or -1")
    if len(unknown) > 1:
        raise ConfigError(f"only one mesh axis may be -1, got {', '.join(f'{a}=-1' for a in unknown)}")
    known = math.prod(s for s in sizes.values() if s != -1)
    if unknown:
        if n % known:
            raise ConfigError(
                f"mesh {_shape_text(sizes)}: the other axes multiply to {known}, which does not divide "
                f"the {n} devices of the run ({layout})"
            )
        sizes[unknown[0]] = n // known
    if math.prod(sizes.values()) != n:
        raise ConfigError(
            f"mesh {_shape_text(sizes)} has {math.prod(sizes.values())} devices, but the run has {n} "
            f"({layout}); choose sizes whose product is {n}, or set one to -1"
        )
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    grid = np.array(ordered, dtype=object).reshape(tuple(sizes[a] for a in AXES))
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def _shape_text(sizes: dict[str, int]) -> str:
    return " x ".join(f"{a}={s}" for a, s in sizes.items())


def _check(path: str, shape: tuple[int, ...], spec: P, mesh: Mesh) -> None:
    if len(spec) > len(shape):
        raise ConfigError(f"parameter '{path}' of shape {shape} has {len(shape)} dimension(s), but its rule gives {spec} for {len(spec)}")
    for dim, axes in enumerate(spec):
        if axes is None:
            continue
        names = axes if isinstance(axes, tuple) else (axes,)
        for name in names:
            if name not in mesh.shape:
                raise ConfigError(f"parameter '{path}': rule {spec} names mesh axis '{name}', but the mesh has {tuple(mesh.shape)}")
        ways = math.prod(mesh.shape[a] for a in names)
        if shape[dim] % ways:
            raise ConfigError(
                f"parameter '{path}' of shape {shape}: dimension {dim} (size {shape[dim]}) is not divisible by "
                f"mesh axis {'x'.join(names)} of size {ways}; change the rule or the mesh"
            )


def shardings_for(tree: Any, rules: Rules, mesh: Mesh, default: P = P()) -> Any:
    """A ``NamedSharding`` for every leaf of ``tree`` (arrays or shape structs)."""

    def one(path, leaf):
        name = _path_str(path)
        shape = tuple(getattr(leaf, "shape", ()))
        spec = spec_for(name, rules, default) if shape else P()
        _check(name, shape, spec, mesh)
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(one, tree)


def shard(tree: Any, rules: Rules, mesh: Mesh, default: P = P()) -> Any:
    """Places every leaf of ``tree`` by the rules. Host values must be the
    same on every process; each process only uploads its own shards."""
    shardings = shardings_for(tree, rules, mesh, default)

    def place(leaf, sharding):
        if isinstance(leaf, jax.Array):
            return jax.jit(lambda x: x, out_shardings=sharding)(leaf)
        host = np.asarray(leaf)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree_util.tree_map(place, tree, shardings)


def init_sharded(fn: Callable[..., Any], rules: Rules, mesh: Mesh, *args: Any, default: P = P()) -> Any:
    """Runs ``fn(*args)`` under ``jit`` with its outputs sharded by the
    rules, so no process ever holds the whole model."""
    shapes = jax.eval_shape(fn, *args)
    return jax.jit(fn, out_shardings=shardings_for(shapes, rules, mesh, default))(*args)


def global_batch(local: Any, mesh: Mesh, spec: P = P(("data", "fsdp"))) -> Any:
    """Per-process numpy batches (a pytree) to global ``jax.Array`` s whose
    leading dimension is the concatenation over processes, in process order."""
    sharding = NamedSharding(mesh, spec)

    def one(x):
        x = np.asarray(x)
        global_shape = (x.shape[0] * jax.process_count(), *x.shape[1:])
        return jax.make_array_from_process_local_data(sharding, x, global_shape)

    return jax.tree_util.tree_map(one, local)


@dataclass(frozen=True)
class Row:
    path: str
    shape: tuple[int, ...]
    dtype: str
    spec: str
    bytes_per_device: int
    replicated: bool


@dataclass(frozen=True)
class Description:
    """What each device holds: one row per leaf, and the totals."""

    rows: list[Row]

    @property
    def bytes_per_device(self) -> int:
        return sum(r.bytes_per_device for r in self.rows)

    @property
    def replicated_bytes_per_device(self) -> int:
        return sum(r.bytes_per_device for r in self.rows if r.replicated)

    @property
    def total_bytes(self) -> int:
        return sum(math.prod(r.shape) * np.dtype(r.dtype).itemsize for r in self.rows)

    @property
    def by_part(self) -> dict[str, int]:
        """Bytes per device of each top-level part of the tree, in order:
        ``{"params": ..., "opt": ...}`` for ``describe({"params": p, "opt": o})``
        (the parameters against the optimizer's state, which under Adam
        holds twice as much)."""
        parts: dict[str, int] = {}
        for r in self.rows:
            part = r.path.split("/", 1)[0]
            parts[part] = parts.get(part, 0) + r.bytes_per_device
        return parts

    def __str__(self) -> str:
        head = ("path", "shape", "dtype", "spec", "bytes/device")
        body = [(r.path, str(r.shape), r.dtype, r.spec, f"{r.bytes_per_device:,}") for r in self.rows]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [head, *body]]
        lines.append(
            f"total per device: {self.bytes_per_device:,} bytes "
            f"(of which replicated: {self.replicated_bytes_per_device:,}); whole tree: {self.total_bytes:,} bytes"
        )
        if len(self.by_part) > 1:
            lines.append("per device by part: " + ", ".join(f"{k} {v:,} bytes" for k, v in self.by_part.items()))
        return "\n".join(lines)


def describe(tree: Any) -> Description:
    """Tabulates the leaves of ``tree`` (arrays, or shape structs with a
    sharding): path, shape, dtype, spec and the bytes each device holds.

    In a meshrun worker, the totals also go to the controller: should this
    rank run out of memory, the failure says what its state needs per
    device and which mesh would fit (describe the state's shapes before
    creating it, and the advice is there even if creating it fails)."""
    rows = []
    mesh = None
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = tuple(getattr(leaf, "shape", ()))
        dtype = np.dtype(getattr(leaf, "dtype", np.float32))
        sharding = getattr(leaf, "sharding", None)
        shard_shape = sharding.shard_shape(shape) if sharding is not None else shape
        spec = getattr(sharding, "spec", P())
        mesh = mesh or getattr(sharding, "mesh", None)
        rows.append(
            Row(
                path=_path_str(path),
                shape=shape,
                dtype=dtype.name,
                spec=str(tuple(spec)),
                bytes_per_device=math.prod(shard_shape) * dtype.itemsize,
                replicated=shard_shape == shape,
            )
        )
    description = Description(rows)
    _tell_controller(description, tree, mesh)
    return description


def _resident_bytes() -> int:
    """This process's resident set (Linux), 0 where unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tell_controller(description: Description, tree: Any, mesh: Any) -> None:
    """Sends what the state needs per device (and, under a memory limit,
    which mesh would fit) to the controller, for an out-of-memory summary."""
    client = _connection.client()
    if client is None or mesh is None:
        return
    sizes = {str(k): int(v) for k, v in dict(mesh.shape).items()}
    limit = os.environ.get(ENV["memory_per_proc"])
    fits = ""
    if limit:
        local = max(jax.local_device_count(), 1)
        # On CPU what the process holds now counts against each device's share.
        runtime = _resident_bytes() // local if jax.default_backend() == "cpu" else 0
        fits = planning.what_fits(tree, int(limit) // local, math.prod(sizes.values()), sizes, runtime)
    client.state_need(
        description.bytes_per_device,
        description.total_bytes,
        list(description.by_part.items()),
        " ".join(f"{k}={v}" for k, v in sizes.items()),
        fits,
    )
