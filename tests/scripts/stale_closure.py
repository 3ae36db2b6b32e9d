# A travelling function that closes over the attempt number, which its key
# cannot see: attempt 2 loads attempt 1's executable, whose check finds it
# stale. Attempt 1 fails after step 4 on purpose.
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import sharding

ctx = meshrun.init()
scale = float(ctx.attempt)
replicated = NamedSharding(sharding.make_mesh(), P())
step_fn = meshrun.jit(lambda x: x * scale + 1.0, name="step", out_shardings=replicated)
state = {"x": jax.device_put(jnp.zeros(4), replicated)}
ckpt = meshrun.get_checkpoint()
start = 0
if ckpt is not None:
    state = meshrun.restore({"x": jax.ShapeDtypeStruct((4,), jnp.float32, sharding=replicated)}, ckpt)
    start = ckpt.step
for step in range(start, 12):
    state = {"x": step_fn(state["x"])}
    meshrun.report({"step": step + 1, "v": float(state["x"][0])}, checkpoint=state)
    if ctx.attempt == 1 and step + 1 == 4:
        raise RuntimeError("attempt 1 fails after step 4")
    time.sleep(0.05)
