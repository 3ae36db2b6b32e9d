# One jitted step across 2 processes: its executable lands in the run's
# compilation cache.
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun

meshrun.init()
mesh = jax.make_mesh((jax.device_count(),), ("x",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), np.ones(4, np.float32), (4 * jax.process_count(),))


@jax.jit
def cached_step(x):
    return jnp.sum(x * 2.0)


print("total", float(cached_step(x)))
