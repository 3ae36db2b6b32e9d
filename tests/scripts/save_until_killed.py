# Restores and checks the newest committed checkpoint (if any), then saves
# steps newest+1, newest+2, ... until killed (or STEPS saves are done).
# Values are a function of the step, so any restore can be checked.
# python save_until_killed.py MIB_PER_RANK STEPS
import json
import os
import sys
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import sharding

mib, steps = int(sys.argv[1]), int(sys.argv[2])
ctx = meshrun.init()
mesh = sharding.make_mesh(data=1, fsdp=-1)
rows = 64 * jax.device_count()
cols = mib * (1 << 20) * jax.process_count() // 4 // rows
spec = NamedSharding(mesh, P("fsdp", None))


def expected(step: int) -> dict:
    w = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + step
    return {"w": w, "ids": np.arange(rows, dtype=np.int32) * step, "step": np.int64(step)}


def place(tree: dict) -> dict:
    return {"w": sharding.shard(tree["w"], [("", P("fsdp", None))], mesh), "ids": sharding.shard(tree["ids"], [("", P("fsdp"))], mesh), "step": tree["step"]}


root = Path(ctx.storage_dir) / "checkpoints"
leftover = sorted(p.name for p in root.glob("tmp-*"))
multihost_utils.sync_global_devices("checked leftovers")  # before anyone saves
ckpt = meshrun.get_checkpoint()
start = 1
if ckpt is not None:
    target = {"w": jax.ShapeDtypeStruct((rows, cols), np.float32, sharding=spec), "ids": jax.ShapeDtypeStruct((rows,), np.int32, sharding=NamedSharding(mesh, P("fsdp"))), "step": np.int64(0)}
    got = meshrun.restore(target, ckpt)
    want = expected(ckpt.step)
    assert int(got["step"]) == ckpt.step, (int(got["step"]), ckpt.step)
    for key in ("w", "ids"):
        for shard in got[key].addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), want[key][shard.index])
    start = ckpt.step + 1
marker = Path(ctx.storage_dir) / f"verified-{ctx.rank}.jsonl"
with open(marker, "a") as f:
    f.write(json.dumps({"restored": None if ckpt is None else ckpt.step, "leftover": leftover, "pid": os.getpid()}) + "\n")
for step in range(start, start + steps):
    meshrun.save(step, place(expected(step)))
meshrun.checkpoint.wait()
