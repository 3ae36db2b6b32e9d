# Steps with a cross-process collective and a report each; in attempt 1,
# rank 1 sleeps forever inside step 3 (so rank 0 waits in the collective).
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import meshrun

ctx = meshrun.init()


def stuck_in_step(step: int) -> None:
    if ctx.attempt == 1 and ctx.rank == 1 and step == 3:
        with open(os.path.join(ctx.storage_dir, "stuck-at"), "w") as f:
            f.write(str(time.time()))
        time.sleep(1e6)


for step in range(6):
    stuck_in_step(step)
    total = multihost_utils.process_allgather(jnp.asarray([step + ctx.rank]))
    meshrun.report({"step": step, "total": int(np.sum(total))})
print(f"done in attempt {ctx.attempt}")
