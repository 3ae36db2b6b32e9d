# Saves and restores in one attempt, writing what each phase gave (or the
# error it raised) to result-RANK.json in the run's storage folder:
#   nothing   wait_committed() before any save
#   newest    save(1), then restore() of the newest checkpoint at once
#   waited    save(2), wait_committed(), restore() of what it returned
#   refused   save(3) with rank 1's file unwritable, wait_committed(3),
#             then restore() of the newest
#   timeout   rank 0 alone saves 4, wait_committed(4, timeout=0.5)
import json
import os
import time
import traceback
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import sharding

ctx = meshrun.init()
mesh = sharding.make_mesh(fsdp=-1, data=1)
spec = NamedSharding(mesh, P("fsdp"))
rows = 4 * jax.device_count()


def state(step: int) -> dict:
    return {"w": sharding.shard(np.arange(rows, dtype=np.float32) + step, [("", P("fsdp"))], mesh), "step": np.int64(step)}


target = {"w": jax.ShapeDtypeStruct((rows,), np.float32, sharding=spec), "step": np.int64(0)}
results: dict = {}


def phase(name, fn):
    try:
        results[name] = fn()
    except Exception as exc:  # noqa: BLE001 - recorded for the test to judge
        results[name] = {"raised": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}


def restored_step() -> int:
    """The step of the newest checkpoint, restored and checked."""
    got = meshrun.restore(target)
    step = int(got["step"])
    want = np.arange(rows, dtype=np.float32) + step
    for shard in got["w"].addressable_shards:
        assert np.array_equal(np.asarray(shard.data), want[shard.index]), (step, np.asarray(shard.data))
    return step


phase("nothing", lambda: meshrun.wait_committed())


def newest():
    meshrun.save(1, state(1))
    return {"restored": restored_step()}


phase("newest", newest)


def waited():
    meshrun.save(2, state(2))
    ckpt = meshrun.wait_committed(timeout=60)
    return {"step": ckpt.step, "path": ckpt.path, "restored": int(meshrun.restore(target, ckpt)["step"])}


phase("waited", waited)


def refused():
    if ctx.rank == 1:
        # A folder where rank 1's file goes: its write fails, as a full or
        # refusing storage would make it.
        (Path(ctx.storage_dir) / "checkpoints" / "tmp-3" / "rank-1.safetensors").mkdir(parents=True)
    meshrun.save(3, state(3))
    try:
        meshrun.wait_committed(3, timeout=60)
    except meshrun.CheckpointError as exc:
        return {"raised": "CheckpointError", "message": str(exc), "restored": restored_step()}
    return {"raised": None}


phase("refused", refused)


def timeout():
    if ctx.rank != 0:
        return None
    meshrun.save(4, state(4))
    t0 = time.monotonic()
    try:
        meshrun.wait_committed(4, timeout=0.5)
    except meshrun.CheckpointError as exc:
        return {"raised": "CheckpointError", "message": str(exc), "waited": time.monotonic() - t0}
    return {"raised": None}


phase("timeout", timeout)
with open(os.path.join(ctx.storage_dir, f"result-{ctx.rank}.json"), "w") as f:
    json.dump(results, f)
