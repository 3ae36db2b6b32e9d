# Steps in lockstep, reporting with the state to save at every step, until
# the file `stop-now` appears in the run folder; a restart resumes from the
# newest checkpoint. python save_through_outage.py
import os
import time

import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import meshrun

ctx = meshrun.init()
state, first = {"w": np.zeros(4, np.float32)}, 1
ckpt = meshrun.get_checkpoint()
if ckpt is not None:
    state, first = meshrun.restore(state, ckpt), ckpt.step + 1
stop = os.path.join(ctx.run_dir, "stop-now")
step = first
while True:
    # Every rank decides together, so that none waits on a collective alone.
    done = multihost_utils.process_allgather(jnp.asarray([float(os.path.exists(stop))]))
    if float(np.max(done)) > 0:
        break
    state = {"w": state["w"] + 1.0}
    meshrun.report({"step": step}, checkpoint=state)
    step += 1
    time.sleep(0.05)
meshrun.checkpoint.wait()
