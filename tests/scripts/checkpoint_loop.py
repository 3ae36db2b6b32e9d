# Steps in lockstep (a collective each), reporting with the state to save
# at every step, until stopped or STEPS; a restart resumes from the newest
# checkpoint. python checkpoint_loop.py [STEPS]
import sys
import time

import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import meshrun

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
ctx = meshrun.init()
state, first = {"w": np.zeros(4, np.float32)}, 1
ckpt = meshrun.get_checkpoint()
if ckpt is not None:
    state, first = meshrun.restore(state, ckpt), ckpt.step + 1
for step in range(first, steps + 1):
    total = multihost_utils.process_allgather(jnp.asarray([float(step)]))
    state = {"w": state["w"] + float(np.sum(total))}
    meshrun.report({"step": step}, checkpoint=state)
    time.sleep(0.02)
