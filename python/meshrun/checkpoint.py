"""Sharded, asynchronous checkpoints: ``meshrun.save``, ``meshrun.restore``,
``meshrun.get_checkpoint``.

``save`` copies the shards this process owns (replica 0 of each addressable
shard of every ``jax.Array``; numpy arrays and scalars on rank 0) to host
memory and returns; a background thread hands the bytes to Rust, which
writes this rank's file into the step's uncommitted folder under
``checkpoints/``, with a CRC per 1 MiB chunk, and syncs it (or, with a
storage URL, uploads it from those same host buffers); then tells the
controller. When every rank has written, the controller writes
``manifest.json`` and renames the folder to ``step-<step>`` (in an object
store: puts the manifest only if none exists): the commit.
A save asked for while the previous one is still writing waits for it
first; :func:`wait` waits for the last one. The controller tells every
worker what became of each step (committed, or why not):
:func:`wait_committed` waits for that, and :func:`get_checkpoint` (so
``restore`` of the newest) waits for this process's last save to be
settled, so that it sees what this attempt has saved.

``restore(target)`` reads, for every leaf of ``target`` (arrays, or
``jax.ShapeDtypeStruct`` s with a sharding), exactly the region each local
device needs, from whichever stored shards overlap it, so a checkpoint
restores onto another process count, mesh or partitioning.

A folder the program wrote itself (with Orbax, say) is checkpointed Ray
Train's way: ``report(metrics, checkpoint=Checkpoint.from_directory(d))``
from one rank or several copies it into the step's folder before
``report`` returns (rank 0's files at the top, rank R's under
``rank-R/``); the step commits once every rank has reported it, and
``get_checkpoint().as_directory()`` gives the folder back.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshrun import _connection, _executable_checks, _goodput, _native, _values
from meshrun._native import ENV
from meshrun.context import get_context
from meshrun.errors import CheckpointError, ConfigError, StorageError

__all__ = ["Checkpoint", "get_checkpoint", "restore", "save", "save_directory", "wait", "wait_committed"]

_writer: threading.Thread | None = None
_writer_error: BaseException | None = None
# Memory checkpoints write on a thread of their own: a durable save still
# writing never holds one back (or the other way round).
_memory_writer: threading.Thread | None = None
# The step of this process's last durable save in this attempt: what
# wait_committed() waits for unless told a step, and what get_checkpoint()
# waits to see settled.
_last_saved: int | None = None
_settled: int | None = None  # the last of those known committed or failed
# How long get_checkpoint() waits for that, and wait_committed() by default:
# a commit follows the slowest rank's write, which an object store can make
# minutes.
_COMMIT_WAIT_S = 300.0


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint: a committed step of a run (its folder, a path or a URL
    such as ``s3://bucket/prefix/NAME/checkpoints/step-40``, and its step),
    or a local folder to hand to :func:`meshrun.report`
    (:meth:`from_directory`; its ``step`` is ``None``)."""

    path: str
    step: int | None = None

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """The local folder ``path`` (written by the program, e.g. with
        Orbax), to pass to ``report(checkpoint=...)``, as in Ray Train."""
        folder = os.fspath(path)
        if "://" in folder:
            raise ConfigError(
                f"Checkpoint.from_directory takes a local folder, got the URL {folder!r}; "
                "write the checkpoint into a local (temporary) folder and meshrun copies it into the run's storage"
            )
        if not os.path.isdir(folder):
            raise ConfigError(f"Checkpoint.from_directory: {folder!r} is not a folder")
        return cls(os.path.abspath(folder))

    def manifest(self) -> dict[str, Any]:
        if self.step is None:
            raise CheckpointError(f"{self.path} is a folder to hand to report(), not a committed checkpoint: it has no manifest")
        return _native.CheckpointReader(self.path).manifest()

    @contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local folder with the checkpoint's files, for as long as the
        ``with`` block lasts: the checkpoint's own folder when it is on
        this host's disk (do not change it), else a copy fetched from the
        run's storage (into the scratch folder) and removed afterwards."""
        if "://" not in self.path:
            yield self.path
            return
        with tempfile.TemporaryDirectory(prefix="meshrun-checkpoint-", dir=_scratch()) as folder:
            _native.fetch_directory(self.path, folder)
            yield folder

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copies the checkpoint's files into ``path`` (default: a new
        temporary folder) and returns it."""
        dest = tempfile.mkdtemp(prefix="meshrun-checkpoint-", dir=_scratch()) if path is None else os.fspath(path)
        os.makedirs(dest, exist_ok=True)
        if self.step is None:
            shutil.copytree(self.path, dest, dirs_exist_ok=True)
        else:
            _native.fetch_directory(self.path, dest)
        return dest

    @property
    def metrics(self) -> dict[str, Any]:
        """The metrics saved with this step."""
        return (self.manifest().get("extra") or {}).get("metrics", {})

    @property
    def extra(self) -> dict[str, Any]:
        """What was passed as ``extra=`` when saving (e.g. the loader's state)."""
        return (self.manifest().get("extra") or {}).get("user", {})


def _scratch() -> str | None:
    """The host's scratch folder, where a fetched checkpoint goes."""
    scratch = os.environ.get(ENV["scratch"])
    return scratch if scratch and os.path.isdir(scratch) else None


def _root() -> str:
    """The run's checkpoints folder: a path, or an object-store URL."""
    ctx = get_context()
    if ctx.storage_dir is None:
        raise ConfigError("checkpoints need a run: start the program with `meshrun run` or Trainer.fit()")
    return _native.checkpoints_dir(str(ctx.storage_dir))


def _leaf_paths(tree: Any) -> list[tuple[str, Any]]:
    import jax

    # sharding imports JAX, which a process that never saves need not load.
    from meshrun.sharding import _path_str

    return [(_path_str(p), leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _host_buffer(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 buffer aligned to 64 bytes: on CPU, JAX then
    adopts it as the device buffer instead of copying it."""
    raw = np.empty(nbytes + 64, np.uint8)
    offset = -raw.ctypes.data % 64
    return raw[offset : offset + nbytes]


def _region(index: tuple[slice, ...], shape: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(s.start or 0, dim if s.stop is None else s.stop) for s, dim in zip(index, shape, strict=True)]


_NUMBERS = (bool, int, float, complex, np.generic)


def _is_key(leaf: Any) -> bool:
    """A typed PRNG key array (``jax.random.key``; NNX keeps them in its
    state): stored as its key data, restored as keys of the same kind."""
    import jax

    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _key_impl(leaf: Any) -> str:
    import jax

    return str(jax.random.key_impl(leaf))


def _storable(path: str, leaf: Any) -> Any:
    """The leaf as it is stored: key data for PRNG keys; refused, naming
    the path, when it is neither an array nor a number."""
    import jax

    if _is_key(leaf):
        return jax.random.key_data(leaf)
    if isinstance(leaf, (jax.Array, *_NUMBERS)):
        return leaf
    if isinstance(leaf, np.ndarray) and leaf.dtype != object:
        return leaf
    raise CheckpointError(
        f"leaf '{path}' of the state is a {type(leaf).__module__}.{type(leaf).__qualname__}: a checkpoint holds arrays "
        "(jax, numpy, PRNG keys) and Python or numpy numbers; leave it out of the state (or keep it in extra=, if it is plain data)"
    )


def _owned_shards(
    tree: Any, rank: int, world: int, every_region: bool = False
) -> list[tuple[str, str, list[int], list[tuple[int, int]], np.ndarray, bool]]:
    """(leaf, dtype, global shape, region, host bytes, per process) of every
    shard this process writes: replica 0 of each shard of a global array,
    or with ``every_region`` each distinct region this process holds (a
    memory checkpoint, which each host restores from its own files alone).
    A per-process leaf (with several processes: an array on this process's
    own devices, a numpy array, a number) is this process's own copy,
    written by every process and given back to each its own. Device-to-host
    copies happen here, before save returns."""
    import jax

    out = []
    for path, leaf in _leaf_paths(tree):
        leaf = _storable(path, leaf)
        if isinstance(leaf, jax.Array) and (world == 1 or not leaf.is_fully_addressable):
            shape = tuple(leaf.shape)
            seen: set[tuple[tuple[int, int], ...]] = set()
            for shard in leaf.addressable_shards:
                region = tuple(_region(shard.index, shape))
                if (every_region and region in seen) or (not every_region and shard.replica_id != 0):
                    continue
                seen.add(region)
                host = np.asarray(shard.data, order="C")
                out.append((path, host.dtype.name, list(shape), _region(shard.index, shape), host, False))
        elif world > 1 or rank == 0 or every_region:
            host = np.asarray(leaf, order="C")
            out.append((path, host.dtype.name, list(host.shape), [(0, d) for d in host.shape], host, world > 1))
    return [(p, d, s, r, h.reshape(-1).view(np.uint8), own) for p, d, s, r, h, own in out]


@_goodput.counts_as("checkpoint")
def wait() -> None:
    """Waits until this process's last :func:`save` has been written, and
    raises what writing it raised (e.g. :class:`CheckpointError`). The
    program's end waits by itself; call it to know this process's part is
    on disk, and :func:`wait_committed` to know the step is committed."""
    _join_writers()


def _settle_writes(limit_s: float) -> None:
    """Lets the saves under way finish, for at most ``limit_s`` seconds, and
    keeps what they raised to themselves: the program has failed, and a
    save it reported before is still worth committing (the controller stops
    the group as soon as it hears of the failure)."""
    deadline = time.monotonic() + limit_s
    for thread in (_writer, _memory_writer):
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))


def _join_writers() -> None:
    global _writer, _writer_error, _memory_writer
    if _writer is not None:
        _writer.join()
        _writer = None
    if _memory_writer is not None:
        _memory_writer.join()
        _memory_writer = None
    if _writer_error is not None:
        err, _writer_error = _writer_error, None
        raise err


@_goodput.counts_as("checkpoint")
def save(step: int, state: Any, *, metrics: dict[str, Any] | None = None, extra: Mapping[str, Any] | None = None) -> None:
    """Checkpoints ``state`` (any pytree of arrays and scalars) as ``step``.
    Returns once the shards are on the host; writing goes on behind."""
    global _writer, _last_saved, _settled
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"checkpoint step must be a non-negative integer, got {step!r}")
    root = _root()
    ctx = get_context()
    wait()
    # Nothing an executable still being checked computed is saved.
    _executable_checks.settle()
    shards = _owned_shards(state, ctx.rank, ctx.world_size)
    _last_saved, _settled = step, None
    info = None
    if ctx.rank == 0:
        leaves = _leaf_paths(state)
        keys = {p: _key_impl(leaf) for p, leaf in leaves if _is_key(leaf)}
        info = _values.plain({"paths": [p for p, _ in leaves], "keys": keys, "metrics": metrics or {}, "user": extra or {}})
    client = _connection.client()

    def write() -> None:
        global _writer_error
        try:
            written = _native.write_shards(root, step, ctx.rank, shards)
        except StorageError as exc:
            if client is not None and _native.save_errors_continue():
                # The step is not committed; the controller records why,
                # and training goes on. The next save tries again.
                client.save_failed(step, str(exc))
            else:
                _writer_error = exc
            return
        except BaseException as exc:  # surfaced by the next save or wait()
            _writer_error = exc
            return
        try:
            if client is not None:
                client.checkpoint_written(step, written, info)
        except BaseException as exc:
            _writer_error = exc

    _writer = threading.Thread(target=write, name=f"meshrun-save-{step}", daemon=True)
    _writer.start()


def _info(state: Any, metrics: dict[str, Any] | None, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    leaves = _leaf_paths(state)
    keys = {p: _key_impl(leaf) for p, leaf in leaves if _is_key(leaf)}
    return _values.plain({"paths": [p for p, _ in leaves], "keys": keys, "metrics": metrics or {}, "user": extra or {}})


@_goodput.counts_as("checkpoint")
def save_memory(step: int, state: Any, *, metrics: dict[str, Any] | None = None, extra: Mapping[str, Any] | None = None) -> None:
    """Keeps ``state`` as memory checkpoint ``step``: this rank's regions
    go into its host's shared memory (``MESHRUN_MEMORY_DIR``), whose agent
    commits them and sends a replica to the buddy host. Returns once the
    shards are on the host, as :func:`save` does."""
    global _memory_writer
    folder = os.environ.get(ENV["memory_dir"])
    client = _connection.client()
    if not folder or client is None:
        return
    ctx = get_context()
    if _memory_writer is not None:
        _memory_writer.join()
    shards = _owned_shards(state, ctx.rank, ctx.world_size, every_region=True)
    info = _info(state, metrics, extra) if ctx.rank == 0 else None

    def write() -> None:
        # Not held for an executable still being checked: an attempt that
        # fails on a stale one restarts from storage (meshrun_machine's
        # Run), whose saves do wait.
        try:
            written = _native.write_shards(folder, step, ctx.rank, shards)
        except Exception as exc:  # noqa: BLE001
            # The step is not kept in memory (the controller never hears of
            # this rank's part); training and durable saves go on.
            print(f"meshrun: memory checkpoint of step {step} not kept on this host: {exc}", file=sys.stderr, flush=True)
            return
        client.memory_written(step, written, info)

    _memory_writer = threading.Thread(target=write, name=f"meshrun-memory-{step}", daemon=True)
    _memory_writer.start()


@_goodput.counts_as("checkpoint")
def save_directory(step: int, folder: str, *, metrics: dict[str, Any] | None = None, extra: Mapping[str, Any] | None = None) -> bool:
    """Copies the local ``folder`` as this rank's part of checkpoint
    ``step`` and tells the controller; returns once the copy is in the
    run's storage (the folder may be deleted then), ``False`` when the
    storage failed and the run's policy is to train on."""
    global _last_saved, _settled
    root = _root()
    ctx = get_context()
    wait()
    _executable_checks.settle()
    _last_saved, _settled = step, None
    client = _connection.client()
    try:
        written = _native.write_directory(root, step, ctx.rank, folder)
    except StorageError as exc:
        if client is not None and _native.save_errors_continue():
            client.save_failed(step, str(exc))
            return False
        raise
    if client is not None:
        client.checkpoint_written(step, written, _values.plain({"metrics": metrics or {}, "user": extra or {}}))
    return True


def _wait_seconds(timeout: Any) -> float | None:
    if timeout is None or (isinstance(timeout, float) and math.isinf(timeout) and timeout > 0):
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise TypeError(f"meshrun.wait_committed(timeout=...) must be a positive number of seconds, or None to wait as long as it takes, got {timeout!r}")
    return float(timeout)


@_goodput.counts_as("checkpoint")
def wait_committed(step: int | None = None, *, timeout: float | None = _COMMIT_WAIT_S) -> Checkpoint:
    """Waits until checkpoint ``step`` (default: the last one this process
    saved) is committed, that is, every rank has written its part and the
    controller has committed it, and returns it. Raises
    :class:`CheckpointError` when the step will never be committed (a
    rank could not write its part), saying why, or when ``timeout``
    seconds pass first (``None``: no limit); and what writing this
    process's part raised."""
    seconds = _wait_seconds(timeout)
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise TypeError(f"meshrun.wait_committed(step=...) must be a non-negative integer, got {step!r}")
    _root()
    _join_writers()
    if step is None:
        if _last_saved is None:
            raise CheckpointError(
                "meshrun.wait_committed(): this process has saved no checkpoint in this attempt; save one first, or name the step: wait_committed(step)"
            )
        step = _last_saved
    client = _connection.client()
    if client is None:
        raise ConfigError(
            "meshrun.wait_committed() needs the run's controller, which commits checkpoints: start the program with `meshrun run` or Trainer.fit()"
        )
    path = client.wait_committed(step, seconds)
    assert path is not None  # a step that will not commit raised
    return Checkpoint(path, step)


def _settle_last_save() -> None:
    """Waits until the controller has said what became of this process's
    last save (committed, or never to be), so that the newest checkpoint
    includes what this attempt has saved."""
    global _settled
    client = _connection.client()
    if _last_saved is None or _last_saved == _settled or client is None:
        return
    _join_writers()
    client.wait_committed(_last_saved, _COMMIT_WAIT_S, failed_ok=True)
    _settled = _last_saved


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from, or None: the one the controller chose
    for this attempt (the newest that verifies, or ``--resume-from``), or a
    newer one this attempt has committed since, once this process's last
    save is committed or known never to be (for up to 300 s, else
    :class:`CheckpointError`). A newer checkpoint that the controller
    skipped as damaged is never given out."""
    _settle_last_save()
    return _chosen_or_newer()


def _chosen_or_newer() -> Checkpoint | None:
    """:func:`get_checkpoint` without waiting for this process's saves: the
    engine decides (``meshrun_worker::resume``), from what the controller
    put in this process's environment."""
    found = _native.resume_choice(_root())
    return None if found is None else Checkpoint(*found)


def _key_data_target(leaf: Any) -> Any:
    """What a PRNG key leaf of a restore target reads: its key data (an
    array, or the shape, dtype and sharding of one)."""
    import jax

    if isinstance(leaf, jax.Array):
        return jax.random.key_data(leaf)
    data = jax.eval_shape(jax.random.key_data, leaf)
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (len(data.shape) - len(sharding.spec))
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec))
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)


@_goodput.counts_as("restore")
def restore(target: Any, checkpoint: Checkpoint | str | os.PathLike | None = None) -> Any:
    """``target``'s tree with every leaf read from the checkpoint (default:
    :func:`get_checkpoint`'s, which includes what this attempt has saved
    and committed), placed by the target leaf's sharding."""
    import jax

    if checkpoint is None:
        checkpoint = get_checkpoint()
        if checkpoint is None:
            raise CheckpointError(f"no committed checkpoint in {_root()}")
    path = checkpoint.path if isinstance(checkpoint, Checkpoint) else os.fspath(checkpoint)
    # A per-process leaf gives each rank its own copy.
    reader = _native.CheckpointReader(path, rank=get_context().rank)
    manifest = reader.manifest()
    keys = (manifest.get("extra") or {}).get("keys") or {}
    if manifest.get("files"):
        raise CheckpointError(
            f"{path} holds a folder a rank handed over (Checkpoint.from_directory), not a sharded state: "
            "open it with `with checkpoint.as_directory() as folder:` and load it as it was written"
        )
    saved = {leaf["path"]: leaf for leaf in manifest["leaves"]}
    from meshrun.sharding import _path_str

    # Every region of every leaf is read in one call, so that what they
    # need is fetched together (from an object store, many ranges at once).
    reads: list[tuple[str, list[tuple[int, int]], np.ndarray]] = []
    plans = []
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]:
        name = _path_str(key_path)
        entry = saved.get(name)
        if entry is None:
            raise CheckpointError(f"leaf '{name}' of the target is not in checkpoint {path}; it holds: {', '.join(sorted(saved)) or 'nothing'}")
        scalar = type(leaf) if isinstance(leaf, (bool, int, float, complex)) else None
        impl = None
        if _is_key(leaf):
            if name not in keys:
                raise CheckpointError(f"leaf '{name}' of the target is a PRNG key, but checkpoint {path} holds plain {saved[name]['dtype']} there")
            impl, leaf = keys[name], _key_data_target(leaf)
        elif name in keys:
            raise CheckpointError(
                f"leaf '{name}': checkpoint {path} holds a PRNG key ({keys[name]}) there, the target asks for {getattr(leaf, 'dtype', type(leaf).__name__)}"
            )
        if not hasattr(leaf, "shape"):  # a Python scalar
            leaf = np.asarray(leaf)
        shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
        if tuple(entry["shape"]) != shape or entry["dtype"] != dtype.name:
            raise CheckpointError(
                f"leaf '{name}': the checkpoint holds {entry['dtype']}{list(entry['shape'])}, the target asks for {dtype.name}{list(shape)}"
            )
        sharding = getattr(leaf, "sharding", None)
        regions = (
            [(None, [(0, d) for d in shape])]
            if sharding is None
            else [(device, _region(index, shape)) for device, index in sharding.addressable_devices_indices_map(shape).items()]
        )
        parts = []
        for device, region in regions:
            out = _host_buffer(int(np.prod([b - a for a, b in region], dtype=np.int64)) * dtype.itemsize)
            reads.append((name, region, out))
            parts.append((device, out.view(dtype).reshape([b - a for a, b in region])))
        plans.append((shape, sharding, parts, scalar, impl))
    reader.read_many(reads)
    leaves = []
    for shape, sharding, parts, scalar, impl in plans:
        if sharding is None:
            value = parts[0][1]
            value = scalar(value.item()) if scalar is not None else value
        else:
            arrays = [jax.device_put(host, device) for device, host in parts]
            value = jax.make_array_from_single_device_arrays(shape, sharding, arrays)
        leaves.append(value if impl is None else jax.random.wrap_key_data(value, impl=impl))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(target), leaves)
