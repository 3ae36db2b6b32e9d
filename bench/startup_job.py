"""The job timed by bench/startup.py: join jax.distributed, run 10 jitted
steps over a global array sharded across every device, exit.

Under meshrun it calls ``jax.distributed.initialize()`` unmodified; launched
by hand it gets explicit arguments: ``--coordinator ADDR --nprocs N --rank R``.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

parser = argparse.ArgumentParser()
parser.add_argument("--coordinator")
parser.add_argument("--nprocs", type=int)
parser.add_argument("--rank", type=int)
args = parser.parse_args()
if args.coordinator:
    jax.distributed.initialize(args.coordinator, args.nprocs, args.rank)
else:
    jax.distributed.initialize()

mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
sharding = NamedSharding(mesh, P("data"))
rows = 64 * jax.device_count()
local = np.ones((rows // jax.process_count(), 128), np.float32)
x = jax.make_array_from_process_local_data(sharding, local, (rows, 128))
w = jnp.eye(128) * 0.5


@jax.jit
def step(x):
    return jnp.tanh(x @ w) + x.mean()


for _ in range(10):
    x = step(x)
    x.block_until_ready()
print(float(x.sum()))
