# An unmodified multi-process JAX script: no meshrun import, no arguments
# to initialize(). It must join the run meshrun started it in.
import json
import os
import sys

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

jax.distributed.initialize()
gathered = multihost_utils.process_allgather(jnp.array([jax.process_index()]))
record = {
    "process_index": jax.process_index(),
    "process_count": jax.process_count(),
    "device_count": jax.device_count(),
    "local_device_count": jax.local_device_count(),
    "gathered": [int(v) for v in gathered.ravel()],
    "argv": sys.argv[1:],
}
out = os.path.join(os.environ["MESHRUN_STORAGE_DIR"], f"plain-{jax.process_index()}.json")
with open(out, "w") as f:
    json.dump(record, f)
# One write: workers run unbuffered, so a print of several pieces can be
# split by Gloo's own messages, which a C++ thread writes to the same pipe.
sys.stdout.write(f"joined {record['process_index']} of {record['process_count']}\n")
sys.stdout.flush()
