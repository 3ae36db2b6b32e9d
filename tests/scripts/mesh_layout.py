# Records which process holds each position of a meshrun mesh.
import json
import os
import sys

import jax

import meshrun
from meshrun import sharding

ctx = meshrun.init()
sizes = dict(zip(("data", "fsdp", "tensor"), map(int, sys.argv[1:4])))
mesh = sharding.make_mesh(**sizes)
layout = [[[d.process_index for d in row] for row in plane] for plane in mesh.devices.tolist()]
if ctx.rank == 0:
    with open(os.path.join(ctx.storage_dir, "layout.json"), "w") as f:
        json.dump({"processes": layout, "hosts": [[[p // (jax.process_count() // ctx.num_hosts) for p in row] for row in plane] for plane in layout]}, f)
