"""The object-storage checkpoint benchmark's worker program (run by
bench/ckpt_s3.py under `meshrun run -n 2 --devices-per-proc 2 --storage
s3://...`, against a SeaweedFS S3 server on loopback).

Builds a pytree like bench/ckpt_job.py's (``--leaves`` float32 arrays,
``--mib`` MiB in all, fsdp=2 x tensor=2 over 4 devices, random values) and for
``--rounds`` rounds, alternating which goes first, measures on the same
server:

  meshrun     blocked (the save call), save (until the step is committed in
              the store), restore (same layout), reshard (onto fsdp=4)
  tensorstore the library Orbax writes through, with its ``s3`` kvstore
              pointed at the server: every leaf a zarr3 array chunked as the
              saved shards, each process writing its own shards (all writes
              in flight at once), then the same two restores reading only
              what each device needs. Orbax itself cannot be pointed at an
              S3 endpoint here (see docs/benchmarks.md), so this is its
              storage layer without its bookkeeping.
  raw         every process uploads its share of the bytes as one object
              and downloads it again, with the client stack and concurrency
              of meshrun's checkpoints: the storage's own limit.

Processes line up on a barrier before each timed section; restores are
checked against the saved values (a sum per leaf). Rank 0 writes the
figures to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from ckpt_job import barrier, targets, touch

import meshrun
from meshrun import _native, sharding


def build(leaves: int, mib: int, mesh) -> dict[str, jax.Array]:
    """bench/ckpt_job.py's tree, but of random values: an object store may
    compress what it stores, and a model's parameters do not compress."""
    rows = 4096
    cols = mib * (1 << 20) // 4 // leaves // rows
    cols -= cols % 4
    spec = NamedSharding(mesh, P("fsdp", "tensor"))
    tree = {}
    for i in range(leaves):
        make = jax.jit(lambda i=i: jax.random.normal(jax.random.key(i), (rows, cols), jnp.float32), out_shardings=spec)
        tree[f"layer{i}"] = make()
    jax.block_until_ready(tree)
    return tree


def checksum(tree) -> list[float]:
    """Per leaf, a sum of the values weighted by their position: a restore
    that puts a block in the wrong place changes it, while the order the
    sum is taken in (the sharding) changes it only by rounding."""

    def one(x):
        weights = (jnp.arange(x.size, dtype=jnp.float32).reshape(x.shape) % 997) / 997
        return jnp.sum(x * weights, dtype=jnp.float32)

    return [float(jax.jit(one)(v)) for v in tree.values()]


def ts_spec(url: str, key: str, shape, chunk) -> dict:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    kvstore = {"driver": "s3", "bucket": bucket, "path": f"{prefix}/{key}/", "endpoint": os.environ["AWS_ENDPOINT_URL"], "aws_region": os.environ.get("AWS_REGION", "us-east-1")}
    metadata = {"shape": list(shape), "data_type": "float32", "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk)}}}
    return {"driver": "zarr3", "kvstore": kvstore, "metadata": metadata}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import tensorstore as ts

    ctx = meshrun.init()
    mesh = sharding.make_mesh(fsdp=2, tensor=2)
    other = sharding.make_mesh(fsdp=4)
    tree = build(args.leaves, args.mib, mesh)
    nbytes = sum(v.nbytes for v in tree.values())
    local = nbytes // jax.process_count()
    want = checksum(tree)
    same, moved = targets(tree, mesh), targets(tree, other)
    storage = ctx.storage_dir  # s3://bucket/prefix/NAME
    times: dict[str, dict[str, list[float]]] = {"meshrun": {}, "tensorstore": {}, "raw": {}}

    def record(tool: str, what: str, seconds: float) -> None:
        times[tool].setdefault(what, []).append(seconds)

    def check(restored, tag: str) -> None:
        got = checksum(restored)
        # Random values sum to near zero: rounding of a sum taken in
        # another order shows as an absolute difference, not a relative one.
        if not np.allclose(got, want, rtol=1e-4, atol=1.0):
            raise SystemExit(f"{tag}: restored values differ: {got} != {want}")

    def restores(tool: str, step: int, restore) -> None:
        for what, target in (("restore", same), ("reshard", moved)):
            touch(local)
            barrier(f"{tool}-{what}-{step}")
            t0 = time.perf_counter()
            restored = jax.block_until_ready(restore(target))
            barrier(f"{tool}-{what}-done-{step}")
            record(tool, what, time.perf_counter() - t0)
            check(restored, f"{tool} {what}")
            del restored

    def meshrun_round(step: int) -> None:
        barrier(f"m-save-{step}")
        t0 = time.perf_counter()
        meshrun.save(step, tree)
        record("meshrun", "blocked", time.perf_counter() - t0)
        meshrun.checkpoint.wait()
        if ctx.rank == 0:  # the controller commits once every rank has written
            # One GET of the manifest per look (a listing would compete
            # with the uploads for the server).
            while True:
                try:
                    _native.CheckpointReader(f"{storage}/checkpoints/step-{step}")
                    break
                except meshrun.CheckpointError:
                    time.sleep(0.01)
        barrier(f"m-saved-{step}")
        record("meshrun", "save", time.perf_counter() - t0)
        ckpt = meshrun.checkpoint.Checkpoint(f"{storage}/checkpoints/step-{step}", step)
        restores("meshrun", step, lambda target: meshrun.restore(target, ckpt))

    def ts_round(step: int) -> None:
        base = f"{storage}/tensorstore"  # delete_existing replaces the last round's
        specs = {}
        for k, v in tree.items():
            chunk = next(iter(v.addressable_shards)).data.shape
            specs[k] = ts_spec(base, k, v.shape, chunk)
        barrier(f"t-save-{step}")
        t0 = time.perf_counter()
        if ctx.rank == 0:
            for spec in specs.values():
                ts.open(spec, create=True, delete_existing=True).result()
        barrier(f"t-created-{step}")
        arrays = {k: ts.open(spec, open=True).result() for k, spec in specs.items()}
        writes = []
        for k, v in tree.items():
            for shard in v.addressable_shards:
                if shard.replica_id == 0:
                    writes.append(arrays[k][shard.index].write(np.asarray(shard.data)))
        record("tensorstore", "blocked", time.perf_counter() - t0)
        for w in writes:
            w.result()
        barrier(f"t-saved-{step}")
        record("tensorstore", "save", time.perf_counter() - t0)

        def restore(target):
            out = {}
            for k, t in target.items():
                reads = [(device, arrays[k][index].read()) for device, index in t.sharding.addressable_devices_indices_map(t.shape).items()]
                parts = [jax.device_put(r.result(), device) for device, r in reads]
                out[k] = jax.make_array_from_single_device_arrays(t.shape, t.sharding, parts)
            return out

        restores("tensorstore", step, restore)

    def raw_round(step: int) -> None:
        barrier(f"r-{step}")
        t0 = time.perf_counter()
        up, down = _native.storage_roundtrip(f"{storage}/raw-{ctx.rank}", local)
        barrier(f"r-done-{step}")
        record("raw", "roundtrip", time.perf_counter() - t0)
        record("raw", "upload", up)
        record("raw", "download", down)

    rounds = (meshrun_round, ts_round, raw_round)
    for r in range(args.rounds):
        order = rounds if r % 2 == 0 else tuple(reversed(rounds))
        for fn in order:
            fn(r + 1)

    if ctx.rank == 0:
        result = {"bytes": nbytes, "leaves": args.leaves, "rounds": args.rounds, "times": times}
        result["median"] = {tool: {k: statistics.median(v) for k, v in t.items()} for tool, t in times.items()}
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
