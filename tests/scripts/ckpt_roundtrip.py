# Saves a tree of several dtypes with one layout, or restores it with
# another and checks every value: python ckpt_roundtrip.py save|restore FSDP TENSOR
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


def expected():
    return {
        "w": np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 7,
        "b16": (np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 3).astype(ml_dtypes.bfloat16),
        "ids": np.arange(4 * 4, dtype=np.int32).reshape(4, 4) - 5,
        "bytes": np.arange(12, dtype=np.uint8),
        "nested": {"step": np.int64(41), "mask": np.array([True, False, True])},
    }


specs = {
    "save": {"w": P("fsdp", None), "b16": P(None, "fsdp"), "ids": P("fsdp", "tensor")},
    "restore": {"w": P(None, "tensor"), "b16": P("tensor", None), "ids": P(None, ("fsdp", "tensor")) if fsdp * tensor <= 4 else P()},
}[mode]
exp = expected()

if mode == "save":
    tree = {k: (sharding.shard(v, [("", specs[k])], mesh) if k in specs else v) for k, v in exp.items()}
    meshrun.save(5, tree, metrics={"loss": 1.5})
    meshrun.checkpoint.wait()
else:
    target = {}
    for k, v in exp.items():
        if k in specs:
            target[k] = jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, specs[k]))
        else:
            target[k] = v
    ckpt = meshrun.get_checkpoint()
    restored = meshrun.restore(target, ckpt)
    ok = {}
    for k, v in exp.items():
        if k in specs:
            got = restored[k]
            assert got.sharding.spec == specs[k], (k, got.sharding.spec)
            for shard in got.addressable_shards:
                np.testing.assert_array_equal(np.asarray(shard.data), v[shard.index])
            ok[k] = True
    np.testing.assert_array_equal(restored["bytes"], exp["bytes"])
    assert restored["nested"]["step"] == 41 and restored["nested"]["mask"].tolist() == [True, False, True]
    # The run folder: with a storage URL, the storage is not a local path.
    with open(os.path.join(ctx.run_dir, f"restored-{ctx.rank}.json"), "w") as f:
        json.dump({"step": ckpt.step, "ok": ok, "metrics": ckpt.manifest()["extra"]["metrics"]}, f)
