# Each step sums over both ranks (a collective), reports the sum as a JAX
# array, unread, then waits for it. At step 5 rank 1 stops for good and
# writes waiting-1, and rank 0 writes paused-0 and waits for the file go:
# the test kills rank 1 meanwhile, so rank 0's step 5, dispatched once go
# appears, fails in Gloo with its metric reported and unread. When rank 0
# begins to exit (meshrun has reported the failure by then) it writes
# exiting-0. These files are in the run's storage folder.
import atexit
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun

ctx = meshrun.init()
mesh = jax.make_mesh((jax.device_count(),), ("x",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), np.ones((jax.local_device_count(),), np.float32))
w = jnp.ones((256, 256), jnp.float32)
# The matrix product makes the step costly enough that JAX on CPU runs it
# behind the call (a cheap one runs within it, and raises there).
total_of = jax.jit(lambda x, w, step: jnp.sum(x) * step + jnp.sum(w @ w) * 0, out_shardings=NamedSharding(mesh, P()))


def mark(name: str) -> None:
    open(os.path.join(ctx.storage_dir, f"{name}-{ctx.rank}"), "w").close()


# Registered after jax.distributed's own exit handler, so it runs first.
atexit.register(mark, "exiting")
for step in range(1, 100_000):
    if step == 5 and ctx.rank == 1:
        mark("waiting")
        time.sleep(600)
    if step == 5:
        mark("paused")
        while not os.path.exists(os.path.join(ctx.storage_dir, "go")):
            time.sleep(0.01)
    total = total_of(x, w, step)
    meshrun.report({"step": step, "total": total})
    total.block_until_ready()
    time.sleep(0.05)
