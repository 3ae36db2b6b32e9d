# Two ranks step together (a collective and a report per step), then one
# of them leaves the others behind. FINISH_MODE:
#   stuck: after the last report rank 1 waits forever in `stuck_after_training`
#          while rank 0 finishes its program;
#   leave: rank 1 returns after step 3 while rank 0 goes on into the
#          collective of step 4, which nobody else joins.
import os
import time

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

import meshrun

ctx = meshrun.init()
mode = os.environ["FINISH_MODE"]


def stuck_after_training() -> None:
    time.sleep(1e6)


for step in range(1, 6):
    if mode == "leave" and ctx.rank == 1 and step == 4:
        break
    multihost_utils.process_allgather(jnp.asarray([step]))
    meshrun.report({"step": step})
if mode == "stuck" and ctx.rank == 1:
    stuck_after_training()
