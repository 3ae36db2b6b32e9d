# Trains a state that mixes what multi-process programs keep: per-process
# leaves (a step counter and a vector on each process's first device, a
# typed PRNG key, a numpy seed and a Python float, each different on each
# process), a replicated array and an fsdp-sharded one, saving every step.
# Resumes from meshrun's checkpoint when there is one; each process must
# get its own copies back. With KILL, rank 1 of attempt 1 SIGKILLs itself
# once step KILL is committed. Writes final-<rank>.npz (every leaf, as this
# process holds it) to the run's storage folder.
# python per_process_state.py STEPS [KILL]
import os
import signal
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import meshrun
from meshrun import sharding

steps = int(sys.argv[1])
kill = int(sys.argv[2]) if len(sys.argv) > 2 else None
ctx = meshrun.init()
mesh = sharding.make_mesh(fsdp=-1, data=1)
rank = ctx.rank

state = {
    "count": jnp.asarray(0, jnp.int32),
    "vec": jnp.arange(4.0, dtype=jnp.float32) + rank,
    "key": jax.random.key(rank),
    "seed": np.int64(100 + rank),
    "scale": 1.0 + rank,
    **sharding.shard(
        {"b": np.zeros((4,), np.float32), "w": np.arange(32.0, dtype=np.float32).reshape(8, 4)},
        [("w", sharding.P("fsdp", None))],
        mesh,
    ),
}

ckpt = meshrun.get_checkpoint()
if ckpt is not None:
    state = meshrun.restore(state, ckpt)
    assert int(state["count"]) == ckpt.step, (int(state["count"]), ckpt.step)
    assert float(state["vec"][0]) == rank + ckpt.step * 0.5, (rank, np.asarray(state["vec"]))
    assert int(state["seed"]) == 100 + rank + ckpt.step, (rank, state["seed"])


@jax.jit
def update_global(w, b):
    return w * 0.5 + b.sum(), b + 1.0


@jax.jit
def update_local(vec, key):
    key, sub = jax.random.split(key)
    return vec + 0.5, key, jax.random.normal(sub, (4,))


for step in range(int(state["count"]) + 1, steps + 1):
    w, b = update_global(state["w"], state["b"])
    vec, key, noise = update_local(state["vec"], state["key"])
    state = {
        "count": state["count"] + 1,
        "vec": vec,
        "key": key,
        "seed": np.int64(state["seed"] + 1),
        "scale": state["scale"] * 1.5 + float(noise[0]),
        "b": b,
        "w": w,
    }
    meshrun.save(step, state)
    meshrun.report({"loss": float(jnp.sum(w))}, step=step)
    if kill == step and ctx.attempt == 1 and rank == 1:
        meshrun.wait_committed(step)
        os.kill(os.getpid(), signal.SIGKILL)
meshrun.checkpoint.wait()

out = {name: np.asarray(jax.random.key_data(v) if name == "key" else v) for name, v in state.items() if name not in ("w", "b")}
for name in ("w", "b"):
    for shard in state[name].addressable_shards:
        out[f"{name}@{shard.device.id}"] = np.asarray(shard.data)
np.savez(Path(ctx.storage_dir) / f"final-{rank}.npz", **out)
