# Data-parallel linear regression for 30 steps on every rank: a jitted
# gradient, averaged across processes each step (so the ranks move in
# lockstep), a report per step ("loss", and "val_loss" every 5 steps) that
# carries the state for `--checkpoint-every`. In attempt 1, rank 1 raises
# at step 12; the restart resumes from the newest committed checkpoint.
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import meshrun

STEPS, FAIL_AT, LR = 30, 12, 0.05

ctx = meshrun.init()
rng = np.random.default_rng(ctx.rank)
w_true = np.arange(1, 5, dtype=np.float32)
x = rng.normal(size=(64, 4)).astype(np.float32)
y = x @ w_true
x_val = np.random.default_rng(1234).normal(size=(32, 4)).astype(np.float32)
y_val = x_val @ w_true


@jax.jit
def loss_and_grad(w, x, y):
    return jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)


@jax.jit
def val_loss(w):
    return jnp.mean((x_val @ w - y_val) ** 2)


def committed_step() -> int:
    ckpt = meshrun.get_checkpoint()
    return ckpt.step if ckpt is not None else 0


state = {"w": np.zeros(4, np.float32)}
first = 1
ckpt = meshrun.get_checkpoint()
if ckpt is not None:
    state = meshrun.restore(state, ckpt)
    first = ckpt.step + 1
    print(f"resumed from step {ckpt.step}", flush=True)

for step in range(first, STEPS + 1):
    if ctx.attempt == 1 and ctx.rank == 1 and step == FAIL_AT:
        # Fail once the checkpoint of step 10 is committed, so that the
        # restart always resumes from it.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and committed_step() < 10:
            time.sleep(0.01)
        raise ValueError(f"injected failure at step {step}")
    loss, grad = loss_and_grad(state["w"], x, y)
    both = multihost_utils.process_allgather(jnp.stack([loss, *grad]))
    mean = np.asarray(both).reshape(-1, 5).mean(axis=0)
    state = {"w": (state["w"] - LR * mean[1:]).astype(np.float32)}
    record = {"step": step, "loss": float(mean[0])}
    if step % 5 == 0:
        record["val_loss"] = float(val_loss(state["w"]))
    meshrun.report(record, checkpoint=state)
    time.sleep(0.05)
print(f"done in attempt {ctx.attempt}", flush=True)
