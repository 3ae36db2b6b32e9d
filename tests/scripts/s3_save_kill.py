# Restores and checks the newest committed checkpoint (if any); from the
# beginning, saves step 1 and waits for its commit. Then saves step 2: in
# attempt 1, rank 1 SIGKILLs itself right after `save` returns, while its
# shard file is still being uploaded (MIB per rank: a multipart upload);
# in later attempts step 2 is saved whole and the program ends.
# python s3_save_kill.py MIB
import json
import os
import signal
import sys
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import sharding

mib = int(sys.argv[1])
ctx = meshrun.init()
mesh = sharding.make_mesh(data=1, fsdp=-1)
rows = 64 * jax.device_count()
cols = mib * (1 << 20) * jax.process_count() // 4 // rows
spec = NamedSharding(mesh, P("fsdp", None))


def expected(step: int) -> np.ndarray:
    return np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + step


def save(step: int) -> None:
    meshrun.save(step, {"w": sharding.shard(expected(step), [("", P("fsdp", None))], mesh), "step": np.int64(step)})


ckpt = meshrun.get_checkpoint()
if ckpt is not None:
    got = meshrun.restore({"w": jax.ShapeDtypeStruct((rows, cols), np.float32, sharding=spec), "step": np.int64(0)}, ckpt)
    assert int(got["step"]) == ckpt.step
    for shard in got["w"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), expected(ckpt.step)[shard.index])
with open(os.path.join(ctx.run_dir, f"verified-{ctx.rank}.jsonl"), "a") as f:
    f.write(json.dumps({"attempt": ctx.attempt, "restored": None if ckpt is None else ckpt.step}) + "\n")
if ckpt is None:
    save(1)
    meshrun.checkpoint.wait()
    deadline = time.monotonic() + 120
    while (meshrun.get_checkpoint() is None) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert meshrun.get_checkpoint() is not None, "step 1 was not committed"
save(2)
if ctx.attempt == 1:
    if ctx.rank == 1:
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)
meshrun.checkpoint.wait()
