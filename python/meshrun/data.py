"""meshrun's data loader: every process gets its slice of each global batch.

Sources (records by index, read in Rust):

- :func:`tokens` — a flat token file (uint8/uint16/uint32, as nanoGPT
  writes them); record i is the window of ``seq_len + 1`` tokens starting at
  token ``i * seq_len``.
- :func:`parquet` — one file, a list or a glob; chosen columns become
  arrays, or with ``seq_len`` one list-of-integers column is packed into
  token windows (the lists are concatenated in file and row order and cut
  like a token file).
- :func:`npy` — row i of a ``.npy`` array is record i.

Every path may be an object-storage URL (``s3://bucket/train.bin``,
``s3://bucket/shards/*.parquet``; ``gs://``, ``az://``), with credentials
and endpoint from the ``AWS_*`` variables or a profile, as for checkpoints.
Remote files are read by range, in blocks fetched ahead of the consumer
into a cache on the scratch disk (``MESHRUN_SCRATCH``, else the system's
temporary folder; at most ``cache_bytes``, default 4 GiB or half the free
space); records, order, resume and slicing are those of the same files on
a local disk.

:class:`Loader` orders records by a seeded permutation per epoch (no
shuffle buffer), gives global step ``s`` the records ``perm[s*B:(s+1)*B]``
and process ``p`` its contiguous slice, and reads ahead in Rust threads
without the GIL. Batches are dicts of numpy arrays over Rust-owned memory;
with ``mesh`` they are global ``jax.Array`` s. ``loader.state()`` is a small
dict; ``Loader(..., state=s)`` resumes exactly there, with any number of
processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from meshrun import _goodput, _native
from meshrun.context import get_context
from meshrun.errors import ConfigError, DataError

__all__ = ["Loader", "Source", "npy", "parquet", "tokens"]


class Source:
    """A data set of fixed-size records (see the module's description)."""

    def __init__(self, native: _native.DataSource, description: str) -> None:
        self._native = native
        self.description = description

    @property
    def records(self) -> int:
        return self._native.records

    @property
    def fingerprint(self) -> str:
        return self._native.fingerprint

    @property
    def fields(self) -> list[tuple[str, str, list[int]]]:
        return self._native.fields

    @property
    def fetched_bytes(self) -> int:
        """Bytes fetched from object storage so far (0 for local files)."""
        return self._native.fetched_bytes

    def __len__(self) -> int:
        return self.records

    def __repr__(self) -> str:
        return f"<meshrun.data.Source {self.description}: {self.records:,} records>"


def tokens(path: str | os.PathLike, dtype: str = "uint16", seq_len: int = 1024, *, cache_bytes: int | None = None) -> Source:
    """Windows of ``seq_len + 1`` tokens from a flat token file (a path or a URL)."""
    _check_bytes("cache_bytes", cache_bytes)
    return Source(_native.DataSource.tokens(os.fspath(path), _dtype_name(dtype), seq_len, cache_bytes), f"tokens {os.fspath(path)}")


def _check_bytes(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ConfigError(f"{name} must be a positive number of bytes, got {value!r}")


def _dtype_name(dtype: Any) -> str:
    # np.uint16, "u2" and "uint16" all mean uint16; anything else is passed
    # on as given so the error names what the user wrote.
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def parquet(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    columns: Sequence[str],
    seq_len: int | None = None,
    *,
    max_memory: int | None = None,
    cache_bytes: int | None = None,
) -> Source:
    """Columns of Parquet files (a path, a list, or a glob; local or URLs).

    Chosen columns that fit in ``max_memory`` bytes decoded (default
    512 MiB) are decoded once, when the source opens. A larger data set is
    read as the order reaches it: a batch's records straight from the pages
    that hold them (write the files with a page index — pyarrow:
    ``write_page_index=True``; without one each row group touched is read
    through), packed token lists a row group at a time through a cache of
    decoded row groups no larger than ``max_memory``.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if isinstance(columns, str):
        columns = [columns]
    _check_bytes("max_memory", max_memory)
    _check_bytes("cache_bytes", cache_bytes)
    files = [os.fspath(p) for p in paths]
    native = _native.DataSource.parquet(files, list(columns), seq_len, max_memory, cache_bytes)
    return Source(native, f"parquet {', '.join(files)}")


def npy(path: str | os.PathLike, *, cache_bytes: int | None = None) -> Source:
    """Rows of a ``.npy`` array (a path or a URL)."""
    _check_bytes("cache_bytes", cache_bytes)
    return Source(_native.DataSource.npy(os.fspath(path), cache_bytes), f"npy {os.fspath(path)}")


class Loader:
    """Batches of ``source`` for this process (see the module's description).

    ``rank`` and ``num_processes`` default to this worker's place in the
    run. Iterating yields dicts: one array per field (shape
    ``(global_batch_size // num_processes, *record_shape)``), plus ``mask``
    (bool) when ``drop_last=False``, and ``index`` (the record ids, -1 for
    padding). With ``mesh``, the fields and the mask are global
    ``jax.Array`` s sharded by ``spec`` (default: the batch over data and
    fsdp); ``index`` stays a numpy array of this process's rows.
    """

    def __init__(
        self,
        source: Source,
        global_batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        prefetch: int = 4,
        threads: int = 2,
        num_epochs: int | None = None,
        mesh: Any = None,
        spec: Any = None,
        state: dict[str, Any] | None = None,
        rank: int | None = None,
        num_processes: int | None = None,
    ) -> None:
        ctx = get_context()
        self.source = source
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.mesh, self.spec = mesh, spec
        self.rank = ctx.rank if rank is None else rank
        self.num_processes = ctx.world_size if num_processes is None else num_processes
        offset = 0
        if state is not None:
            offset = self._check_state(state)
        for name, value in (("global_batch_size", global_batch_size), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"Loader {name} must be a non-negative integer, got {value!r}")
        self._native = _native.DataLoader(
            source._native,
            global_batch=global_batch_size,
            rank=self.rank,
            processes=self.num_processes,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
            prefetch=prefetch,
            threads=threads,
            offset=offset,
            epochs=num_epochs,
        )
        n = source.records
        self.steps_per_epoch = n // global_batch_size if drop_last else -(-n // global_batch_size)
        local = global_batch_size // self.num_processes
        # (name, numpy dtype, batch shape) of every field, resolved once.
        self._fields = [(name, np.dtype(dtype), (local, *shape)) for name, dtype, shape in source.fields]

    def _check_state(self, state: dict[str, Any]) -> int:
        if state.get("fingerprint") != self.source.fingerprint:
            raise DataError(
                f"the saved loader state is for another data set (fingerprint {state.get('fingerprint')}, "
                f"this data set is {self.source.fingerprint}); resume with the same files, seq_len and columns, "
                "or start without a state"
            )
        for key in ("seed", "shuffle", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(f"the saved loader state has {key}={state[key]!r}, this loader {key}={getattr(self, key)!r}; they must match to resume")
        offset = int(state["offset"])
        if offset % self.global_batch_size:
            raise ConfigError(
                f"the saved offset {offset} is not a whole number of global batches of {self.global_batch_size}; "
                "resume with a global batch size that divides it"
            )
        return offset

    def state(self) -> dict[str, Any]:
        """Where the next batch starts: enough to resume exactly there."""
        offset = self._native.offset
        per_epoch = self.steps_per_epoch * self.global_batch_size
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "epoch": offset // per_epoch if per_epoch else 0,
            "offset": offset,
            "global_batch_size": self.global_batch_size,
            "fingerprint": self.source.fingerprint,
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    @_goodput.counts_as("data")
    def __next__(self) -> dict[str, Any]:
        got = self._native.next()
        if got is None:
            raise StopIteration
        _step, _epoch, raws, mask, index = got
        batch: dict[str, Any] = {}
        for (name, dtype, shape), raw in zip(self._fields, raws, strict=True):
            batch[name] = raw.view(dtype).reshape(shape)
        if not self.drop_last:
            batch["mask"] = mask.view(np.bool_)
        if self.mesh is not None:
            from meshrun import sharding  # imports JAX: only with a mesh

            spec = self.spec if self.spec is not None else sharding.P(("data", "fsdp"))
            batch = sharding.global_batch(batch, self.mesh, spec)
        # This process's record ids stay on the host: they are bookkeeping.
        batch["index"] = index
        return batch
