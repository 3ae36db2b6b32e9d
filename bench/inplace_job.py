"""One process of bench/inplace.py: JAX's fault-tolerance mode
(``jax_enable_recoverability``) on CPU, with meshrun out of the way.

Every step runs a sum over an array sharded across the live devices inside
``multihost_utils.live_devices`` and blocks on it, so a step either succeeds
on every live process or raises on every one (JAX's atomicity rule). Each
process appends what happened to ``OUT/process-P.jsonl``: ``step`` records
(with the number of live devices and the sum, which must equal it) and
``error`` records, with wall times.

A replacement (``--replacement``) has JAX imported and waits for ``GO`` to
exist, as a warm spare would, then joins under the dead process's id. Its
first act is to delete the Gloo rendezvous keys its devices' previous
incarnation left in the coordination service's store (a Gloo context
refuses to start over a key that exists).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--process", type=int, required=True)
p.add_argument("--processes", type=int, required=True)
p.add_argument("--port", type=int, required=True)
p.add_argument("--out", type=Path, required=True)
p.add_argument("--replacement", action="store_true")
p.add_argument("--timeout", type=int, default=1, help="heartbeat and CPU collective timeouts (whole seconds: XLA takes no less)")
args = p.parse_args()

os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=2"
    f" --xla_cpu_collective_timeout_seconds={args.timeout}"
    f" --xla_cpu_collective_call_terminate_timeout_seconds={args.timeout}"
)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_enable_recoverability", True)
out = open(args.out / f"process-{args.process}.jsonl", "a")


def record(**fields) -> None:
    out.write(json.dumps({"time": time.time(), "process": args.process, "replacement": args.replacement, **fields}) + "\n")
    out.flush()


if args.replacement:
    go = args.out / "GO"
    while not go.exists():
        time.sleep(0.002)
jax.distributed.initialize(f"127.0.0.1:{args.port}", args.processes, args.process, heartbeat_timeout_seconds=args.timeout)
if args.replacement:
    client = jax._src.distributed.global_state.client
    mine = {d.id for d in jax.local_devices()}
    stale = 0
    for key, _ in client.key_value_dir_get_bytes("cpu:gloo/"):
        ids, position = key.split("/")[-2:]
        if position.isdigit() and int(ids.split(",")[int(position)]) in mine:
            client.key_value_delete(key)
            stale += 1
    record(event="joined", stale_keys=stale)

total = jax.jit(lambda x: jnp.sum(x))
stop = args.out / "STOP"
step = 0
while not stop.exists():
    try:
        with multihost_utils.live_devices(jax.devices()) as devices:
            mesh = Mesh(np.array(devices), ("d",))
            x = jax.make_array_from_callback((len(devices),), NamedSharding(mesh, P("d")), lambda i: np.ones(1, np.float32))
            value = float(jax.block_until_ready(total(x)))
    except Exception as e:  # noqa: BLE001 - every failure is a record here
        record(event="error", type=type(e).__name__, message=str(e)[:300])
        time.sleep(0.01)
        continue
    step += 1
    record(event="step", step=step, devices=len(devices), value=value)
    time.sleep(0.02)
sys.exit(0)
