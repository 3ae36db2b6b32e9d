# Saves a small sharded tree at steps 1..N with the given losses.
import sys

import numpy as np
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import sharding

meshrun.init()
mesh = sharding.make_mesh(fsdp=-1, data=1)
for step, loss in enumerate(map(float, sys.argv[1:]), start=1):
    tree = {"w": sharding.shard(np.full((4, 2), step, np.float32), [("w", P("fsdp"))], mesh)}
    meshrun.save(step, tree, metrics={"loss": loss})
