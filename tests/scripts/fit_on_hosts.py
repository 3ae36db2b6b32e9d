# Trainer.fit on hosts that join by themselves: python fit_on_hosts.py
# LISTEN STORAGE. The function travels to every host over the control
# connection; prints the result as JSON.
import json
import sys

import meshrun


def psum_fn(config):
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    ctx = meshrun.get_context()
    total = multihost_utils.process_allgather(jnp.array(ctx.rank + config["scale"])).sum()
    meshrun.report({"sum": int(total), "devices": jax.device_count(), "host": ctx.host_rank})


listen, storage = sys.argv[1], sys.argv[2]
result = meshrun.Trainer(
    psum_fn,
    train_loop_config={"scale": 1},
    scaling_config=meshrun.ScalingConfig(num_workers=2, num_hosts=2, listen=listen, join_timeout_s=60),
    run_config=meshrun.RunConfig(name="fit", storage_path=storage, tee="none"),
).fit()
print(json.dumps({"error": None if result.error is None else str(result.error), "metrics": result.metrics}))
