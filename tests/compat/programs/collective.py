# An unmodified multi-process JAX program, and what the compatibility suite
# reads of it: it joins the run with a bare jax.distributed.initialize(),
# computes a jitted sum over an array sharded across every process (a
# collective), gathers each process's index, reports a metric, and writes
# which of meshrun's hooks on JAX's private modules are on here, and the
# addresses this process listens on (gloo's, among them).
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import _jax_private


def listening() -> list[str]:
    """The IPv4 addresses of this process's listening TCP sockets."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    with open("/proc/self/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # LISTEN
                ip = bytes.fromhex(local.split(":")[0])[::-1]
                found.append(".".join(str(b) for b in ip))
    return sorted(found)


before = _jax_private.backends_are_initialized()
jax.distributed.initialize()
mesh = jax.make_mesh((jax.device_count(),), ("x",))
local = np.full((jax.local_device_count(),), jax.process_index() + 1, np.float32)
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), local)


@jax.jit
def compat_total(x):
    return jnp.sum(x * 2.0)


total = float(compat_total(x))
gathered = multihost_utils.process_allgather(jnp.array([jax.process_index()]))
meshrun.report({"step": 1, "loss": total / 8, "total": total})
record = {
    "jax": jax.__version__,
    "meshrun": os.path.dirname(meshrun.__file__),
    "process_index": jax.process_index(),
    "process_count": jax.process_count(),
    "device_count": jax.device_count(),
    "total": total,
    "gathered": [int(v) for v in np.asarray(gathered).ravel()],
    "backends_before": before,
    "backends_after": _jax_private.backends_are_initialized(),
    "hooks": _jax_private.hook_status(),
    "host_ip": os.environ.get("MESHRUN_HOST_IP"),
    "listening": listening(),
    "coordinator": os.environ.get("JAX_COORDINATOR_BIND_ADDRESS", ""),
}
with open(os.path.join(meshrun.get_context().storage_dir, f"collective-{jax.process_index()}.json"), "w") as f:
    json.dump(record, f)
sys.stdout.write(f"total {total}\n")
