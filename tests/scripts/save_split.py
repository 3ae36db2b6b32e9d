# Saves step 3 of a tree whose leaf 'w' is split over the two processes, so
# the checkpoint has a shard file from each rank.
import numpy as np

import meshrun
from meshrun import sharding

meshrun.init()
mesh = sharding.make_mesh(fsdp=2)
w = np.arange(32, dtype=np.float32).reshape(8, 4)
state = sharding.shard({"w": w, "b": np.ones(4, np.float32)}, [("w", sharding.P("fsdp", None))], mesh)
meshrun.save(3, state)
meshrun.checkpoint.wait()
