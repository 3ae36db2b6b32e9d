"""Describes a replicated state (so meshrun knows what it needs per device),
then rank ARGV[1] takes host memory 64 MiB at a time until its limit ends
it; the other ranks wait to be stopped. With ARGV[2] == "xla", that rank
asks XLA for twice the machine's memory instead, which XLA refuses with
RESOURCE_EXHAUSTED."""

import os
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import sharding

meshrun.init()
rank = jax.process_index()
mesh = sharding.make_mesh(data=-1)
weight = jax.ShapeDtypeStruct((4096, 4096), jnp.float32)
shapes = {"params": {"w": weight}, "opt": {"mu": {"w": weight}, "nu": {"w": weight}}}
placed = sharding.shardings_for(shapes, [(r"w$", P("fsdp", None))], mesh)
sharding.describe(jax.tree.map(lambda s, p: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=p), shapes, placed))
meshrun.report({"step": 0})
if rank == int(sys.argv[1]):
    if sys.argv[2:] == ["xla"]:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        jnp.zeros((2 * pages,), dtype=jnp.uint8).block_until_ready()
    held = []
    while True:
        held.append(np.ones(64 << 20, dtype=np.uint8))
# Until meshrun stops it, however long that takes.
threading.Event().wait()
