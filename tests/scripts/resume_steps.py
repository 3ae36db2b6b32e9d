# Restores the checkpoint meshrun.get_checkpoint() gives (if any) and checks
# every value, writes the step it resumed from to resumed-<attempt>-<rank>.json,
# then saves the next SAVE steps (a (4, 2) leaf split over the ranks, every
# value equal to the step). With "damage", attempt 1 then flips a byte of
# rank 0's shard of its last step, once committed, and fails, so that the
# run restarts. python resume_steps.py SAVE [damage]
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import sharding

save = int(sys.argv[1])
damage = sys.argv[2:] == ["damage"]
ctx = meshrun.init()
mesh = sharding.make_mesh(fsdp=-1, data=1)

ckpt = meshrun.get_checkpoint()
first = 1
if ckpt is not None:
    target = {"w": jax.ShapeDtypeStruct((4, 2), np.float32, sharding=NamedSharding(mesh, P("fsdp")))}
    got = meshrun.restore(target, ckpt)
    for shard in got["w"].addressable_shards:
        assert (np.asarray(shard.data) == ckpt.step).all(), (ckpt.step, np.asarray(shard.data))
    first = ckpt.step + 1
Path(ctx.storage_dir, f"resumed-{ctx.attempt}-{ctx.rank}.json").write_text(json.dumps({"step": None if ckpt is None else ckpt.step}))

for step in range(first, first + save):
    meshrun.save(step, sharding.shard({"w": np.full((4, 2), step, np.float32)}, [("w", P("fsdp"))], mesh))
meshrun.checkpoint.wait()

if damage and ctx.attempt == 1 and ctx.rank == 0:
    last = first + save - 1
    manifest = Path(ctx.storage_dir, "checkpoints", f"step-{last}", "manifest.json")
    deadline = time.monotonic() + 30
    while not manifest.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    # What this attempt committed is what it resumes from now.
    assert meshrun.get_checkpoint().step == last, meshrun.get_checkpoint()
    shard = manifest.parent / "rank-0.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0x01  # inside the tensor's data
    shard.write_bytes(bytes(raw))
    raise RuntimeError(f"injected failure after damaging step {last}")
