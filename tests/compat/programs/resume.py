# Data-parallel linear regression, checkpointed every 2 steps through
# `meshrun.report(checkpoint=...)` (with --checkpoint-every 2): each step's
# batch depends only on the step and the rank, and the gradient is averaged
# across processes, so a run killed and resumed from its newest checkpoint
# must end with the same parameters, bit for bit, as one never interrupted.
# Rank 0 writes them (hex of their bytes) to final.json. STEPS and a pause
# per step come from the command line: python resume.py STEPS PAUSE
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import meshrun

steps, pause = int(sys.argv[1]), float(sys.argv[2])
ctx = meshrun.init()


@jax.jit
def loss_and_grad(w, x, y):
    return jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)


state = {"w": np.zeros(8, np.float32)}
first = 1
ckpt = meshrun.get_checkpoint()
if ckpt is not None:
    state = meshrun.restore(state, ckpt)
    first = ckpt.step + 1
    print(f"resumed from step {ckpt.step}", flush=True)
w_true = np.linspace(-1, 1, 8, dtype=np.float32)
for step in range(first, steps + 1):
    rng = np.random.default_rng(1000 * step + ctx.rank)
    x = rng.normal(size=(32, 8)).astype(np.float32)
    y = x @ w_true
    loss, grad = loss_and_grad(state["w"], x, y)
    both = np.asarray(multihost_utils.process_allgather(jnp.concatenate([loss[None], grad])))
    mean = both.reshape(-1, 9).mean(axis=0)
    state = {"w": (np.asarray(state["w"]) - 0.05 * mean[1:]).astype(np.float32)}
    meshrun.report({"step": step, "loss": float(mean[0])}, checkpoint=state)
    time.sleep(pause)
if ctx.rank == 0:
    with open(os.path.join(ctx.storage_dir, "final.json"), "w") as f:
        json.dump({"w": np.asarray(state["w"]).tobytes().hex(), "attempt": ctx.attempt, "first": first}, f)
