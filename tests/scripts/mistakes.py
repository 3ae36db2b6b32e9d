"""Multi-host mistakes, one per MISTAKE (and none with MISTAKE=none):

  constant   a rank-dependent Python constant changes the traced program
             (rank 1's has one more reduction: it waits in a collective
             rank 0 never enters);
  reorder    a rank-dependent condition inside one jitted function
             reorders two collectives;
  skip       a rank-dependent branch: rank 0 sums once more, alone;
  rows       per-process batches of different sizes passed to
             jax.make_array_from_process_local_data (JAX builds a wrong
             global array without a word);
  seed       replicated parameters initialized from a per-process seed
             (each process trains its own numbers);
  none       what may differ per rank: rank 0's own evaluation on its
             local device, and a computation over every device that does
             not communicate (the mean of a replicated array), on rank 0
             only.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import meshrun

jax.distributed.initialize()
mistake = os.environ["MISTAKE"]
rank = jax.process_index()
mesh = jax.make_mesh((jax.device_count(),), ("d",))
rows = 2 * jax.local_device_count()
if mistake == "rows":
    rows = 8 if rank == 0 else 6
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), np.ones((rows, 4), np.float32))
repeats = 3 if mistake == "constant" and rank == 1 else 2


@jax.jit
def normalize(x):
    for _ in range(repeats):
        x = x / jnp.sum(x)
    return x


@jax.jit
def reordered(x):
    total, biggest = jnp.sum(x), jnp.max(x)
    if mistake == "reorder" and rank == 1:
        return biggest / total + jnp.max(x * 2) * jnp.sum(x * 3)
    return total / biggest + jnp.sum(x * 3) * jnp.max(x * 2)


replicated = NamedSharding(mesh, P())
w = np.random.default_rng(rank if mistake == "seed" else 0).normal(size=(4, 4)).astype(np.float32)
params = {"w": jax.make_array_from_process_local_data(replicated, w)}


@jax.jit
def step(params, x):
    def loss(p):
        return jnp.mean((normalize(x) @ p["w"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value + reordered(x)


for i in range(3):
    params, loss = step(params, x)
    meshrun.report({"loss": loss}, step=i, checkpoint=params)
if mistake == "skip" and rank == 0:
    loss = normalize(x * 2).sum()
if mistake == "none" and rank == 0:
    local = jax.device_put(np.arange(8.0), jax.local_devices()[0])
    print("rank 0's own evaluation:", float(jax.jit(jnp.mean)(local)), float(jnp.mean(params["w"])))
print("loss", float(loss))
