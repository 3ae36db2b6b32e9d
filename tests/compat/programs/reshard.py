# Saves a tree of several dtypes sharded one way, or restores it sharded
# another way (another process count, other devices per process) and checks
# every value of every shard. python reshard.py save|restore FSDP TENSOR
import json
import os
import sys

import jax
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import sharding

mode, fsdp, tensor = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ctx = meshrun.init()
mesh = sharding.make_mesh(fsdp=fsdp, tensor=tensor)
values = {
    "w": np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 7,
    "b16": (np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 3).astype(ml_dtypes.bfloat16),
    "ids": np.arange(4 * 4, dtype=np.int32).reshape(4, 4) - 5,
}
if mode == "save":
    specs = {"w": P("fsdp", "tensor"), "b16": P(None, "fsdp"), "ids": P("tensor", "fsdp")}
    tree = {k: sharding.shard(v, [("", specs[k])], mesh) for k, v in values.items()}
    tree["count"] = np.int64(41)
    meshrun.save(5, tree, metrics={"loss": 1.5})
    meshrun.wait_committed(5)
else:
    specs = {"w": P(None, "fsdp"), "b16": P("fsdp", None), "ids": P()}
    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, specs[k])) for k, v in values.items()}
    target["count"] = np.int64(0)
    ckpt = meshrun.get_checkpoint()
    restored = meshrun.restore(target, ckpt)
    shards = 0
    for k, v in values.items():
        got = restored[k]
        assert got.sharding.spec == specs[k], (k, got.sharding.spec)
        for shard in got.addressable_shards:
            assert np.asarray(shard.data).tobytes() == np.ascontiguousarray(v[shard.index]).tobytes(), k
            shards += 1
    assert int(restored["count"]) == 41
    with open(os.path.join(ctx.storage_dir, f"restored-{ctx.rank}.json"), "w") as f:
        json.dump({"step": ckpt.step, "shards": shards, "devices": jax.device_count(), "processes": jax.process_count()}, f)
