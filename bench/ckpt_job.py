"""The checkpoint benchmark's worker program (run by bench/ckpt.py under
`meshrun run -n 2 --devices-per-proc 2`).

Builds a pytree of ``--leaves`` float32 arrays, ``--mib`` MiB in all,
sharded over the 4 devices as ``fsdp=2, tensor=2`` (rows over fsdp, columns
over tensor), then for ``--rounds`` rounds, alternating which goes first,
measures for meshrun and for Orbax (``StandardCheckpointer``, its async
default) on the same disk:

  blocked   the save call, from before it to its return (training could
            go on from there)
  save      from before the save call until the checkpoint is committed
            (meshrun: ``step-N/manifest.json`` written by the controller;
            Orbax: ``wait_until_finished`` returned on every process)
  restore   restore onto the saved layout, until every array is ready
  reshard   restore onto another mesh and partitioning (fsdp=4 over rows
            only, i.e. 4 row blocks instead of 2 x 2 tiles)

Processes line up on a barrier before each timed section. Before each
timed restore (of either tool) every process first touches and frees a
buffer of its restore size, timed on its own as ``touch``: on these virtual
machines the first touch of fresh memory after a large write sometimes
stalls in the kernel for about a second, which would otherwise land at
random in one tool's restore figure. Rank 0 writes
the figures to ``--out`` as JSON; the restored values are compared with the
saved ones (a sum per leaf), so a fast wrong restore cannot pass.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import sharding


def barrier(name: str) -> None:
    multihost_utils.sync_global_devices(name)


def build(leaves: int, mib: int, mesh) -> dict[str, jax.Array]:
    rows = 4096
    cols = mib * (1 << 20) // 4 // leaves // rows
    cols -= cols % 4
    spec = NamedSharding(mesh, P("fsdp", "tensor"))
    tree = {}
    for i in range(leaves):
        make = jax.jit(lambda i=i: jnp.arange(rows * cols, dtype=jnp.float32).reshape(rows, cols) * (i + 1) / 7, out_shardings=spec)
        tree[f"layer{i}"] = make()
    jax.block_until_ready(tree)
    return tree


def touch(nbytes: int) -> float:
    """Seconds to fault in (and free) ``nbytes`` of fresh memory."""
    t0 = time.perf_counter()
    buf = np.empty(nbytes, np.uint8)
    buf[::4096] = 1
    del buf
    return time.perf_counter() - t0


def checksum(tree) -> list[float]:
    return [float(jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))(v)) for v in tree.values()]


def targets(tree, mesh) -> dict:
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, v.sharding.spec)) for k, v in tree.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import orbax.checkpoint as ocp

    ctx = meshrun.init()
    mesh = sharding.make_mesh(fsdp=2, tensor=2)
    other = sharding.make_mesh(fsdp=4)
    tree = build(args.leaves, args.mib, mesh)
    nbytes = sum(v.nbytes for v in tree.values())
    local = nbytes // jax.process_count()
    want = checksum(tree)
    same, moved = targets(tree, mesh), targets(tree, other)
    orbax_root = Path(ctx.run_dir) / "orbax"
    ckpt_root = Path(ctx.run_dir) / "checkpoints"
    orbax = ocp.StandardCheckpointer()
    times: dict[str, dict[str, list[float]]] = {"meshrun": {}, "orbax": {}}

    def record(tool: str, what: str, seconds: float) -> None:
        times[tool].setdefault(what, []).append(seconds)

    def check(restored, tag: str) -> None:
        got = checksum(restored)
        if not np.allclose(got, want, rtol=1e-6):
            raise SystemExit(f"{tag}: restored values differ: {got} != {want}")

    def restores(tool: str, step: int, restore) -> None:
        """Times ``restore`` onto the saved layout and onto the other mesh,
        each after the fresh-memory touch, and checks what it returns."""
        for what, target in (("restore", same), ("reshard", moved)):
            record(tool, "touch", touch(local))
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
            while not (ckpt_root / f"step-{step}" / "manifest.json").exists():
                time.sleep(0.001)
        barrier(f"m-saved-{step}")
        record("meshrun", "save", time.perf_counter() - t0)
        ckpt = meshrun.checkpoint.Checkpoint(str(ckpt_root / f"step-{step}"), step)
        restores("meshrun", step, lambda target: meshrun.restore(target, ckpt))

    def orbax_round(step: int) -> None:
        path = orbax_root / f"step-{step}"
        barrier(f"o-save-{step}")
        t0 = time.perf_counter()
        orbax.save(path, tree)
        record("orbax", "blocked", time.perf_counter() - t0)
        orbax.wait_until_finished()
        barrier(f"o-saved-{step}")
        record("orbax", "save", time.perf_counter() - t0)
        restores("orbax", step, lambda target: orbax.restore(path, target))

    for r in range(args.rounds):
        order = (meshrun_round, orbax_round) if r % 2 == 0 else (orbax_round, meshrun_round)
        for fn in order:
            fn(r + 1)
        # Keep the disk from filling: drop this round's checkpoints.
        barrier(f"clean-{r}")
        if ctx.rank == 0:
            shutil.rmtree(orbax_root / f"step-{r + 1}", ignore_errors=True)
            shutil.rmtree(ckpt_root / f"step-{r + 1}", ignore_errors=True)
        barrier(f"cleaned-{r}")

    orbax.close()
    if ctx.rank == 0:
        result = {"bytes": nbytes, "leaves": args.leaves, "rounds": args.rounds, "times": times}
        result["median"] = {tool: {k: statistics.median(v) for k, v in t.items()} for tool, t in times.items()}
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
