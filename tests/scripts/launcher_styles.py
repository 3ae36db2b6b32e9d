# Each rank joins jax.distributed the way programs written for another
# launcher do, reading only that launcher's variables, exactly as those
# programs read them: all of them must meet in one run.
import json
import os
import socket
import sys

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

STYLES = ["jax", "kubeflow", "maxtext_cpu", "maxtext_gpu", "torchrun", "shim"]
style = STYLES[int(os.environ["MESHRUN_RANK"]) % len(STYLES)]

if style == "jax":
    jax.distributed.initialize()
elif style == "kubeflow":
    # Kubeflow's JAXJob examples.
    jax.distributed.initialize(
        coordinator_address=f"{os.environ['COORDINATOR_ADDRESS']}:{os.environ['COORDINATOR_PORT']}",
        num_processes=int(os.environ["NUM_PROCESSES"]),
        process_id=int(os.environ["PROCESS_ID"]),
    )
elif style == "maxtext_cpu":
    # MaxText's initialize_jax_for_cpu: a bare host name, XPK's fixed port.
    ip = socket.gethostbyname(os.environ["JAX_COORDINATOR_ADDRESS"])
    pid = int(os.environ["JOB_INDEX"]) * int(os.environ["PROCESSES_IN_JOB"]) + int(os.environ["JOB_COMPLETION_INDEX"])
    jax.distributed.initialize(coordinator_address=ip + ":1234", process_id=pid, num_processes=int(os.environ["JAX_PROCESS_COUNT"]))
elif style == "maxtext_gpu":
    # MaxText's initialize_jax_for_gpu.
    jax.distributed.initialize(
        coordinator_address=f"{os.environ['JAX_COORDINATOR_IP']}:{os.environ['JAX_COORDINATOR_PORT']}",
        num_processes=int(os.getenv("NNODES")),
        process_id=int(os.getenv("NODE_RANK")),
    )
elif style == "torchrun":
    jax.distributed.initialize(
        coordinator_address=f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        num_processes=int(os.environ["WORLD_SIZE"]),
        process_id=int(os.environ["RANK"]),
    )
else:
    # A launch shim that sets JAX's variable its own way before the
    # program's plain initialize().
    os.environ["JAX_COORDINATOR_ADDRESS"] = "localhost"
    jax.distributed.initialize()

gathered = multihost_utils.process_allgather(jnp.array([jax.process_index()]))
record = {
    "style": style,
    "process_index": jax.process_index(),
    "process_count": jax.process_count(),
    "gathered": [int(v) for v in gathered.ravel()],
}
with open(os.path.join(os.environ["MESHRUN_STORAGE_DIR"], f"style-{jax.process_index()}.json"), "w") as f:
    json.dump(record, f)
sys.stdout.write(f"{style} joined as {record['process_index']} of {record['process_count']}\n")
sys.stdout.flush()
