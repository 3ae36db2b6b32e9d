# One process of tests/test_executables.py: jits a function over a mesh of
# its 4 CPU devices (`2x2` or `4`) that closes over `scale`, and prints what
# its first call did, its result, and whether the check of a loaded
# executable found it stale.
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import _executable_checks

layout, scale = [int(n) for n in sys.argv[1].split("x")], float(sys.argv[2])
mesh = Mesh(np.array(jax.devices()).reshape(layout), ("a", "b")[: len(layout)])
x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("a")))


def step(x):
    return jnp.tanh(x * scale).sum(axis=1)


f = meshrun.jit(step, name="step")
y = f(x)
shapes = meshrun.eval_shape(lambda: {"w": jnp.zeros((3, int(scale)))}, name="shapes")
stale = None
try:
    _executable_checks.settle()
except meshrun.StaleExecutableError as exc:
    stale = str(exc)
print(json.dumps({"outcomes": f.outcomes, "y": np.asarray(y).tolist(), "shapes": list(shapes["w"].shape), "stale": stale}))
