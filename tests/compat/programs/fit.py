# meshrun.Trainer(...).fit() from a user's program: the function runs on 2
# workers with jax.distributed initialized, sums a value across them and
# reports it; this process prints the Result as JSON. python fit.py RUNS_DIR
import json
import sys

import meshrun


def train(config):
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    ctx = meshrun.get_context()
    total = multihost_utils.process_allgather(jnp.array([ctx.rank + 1])).sum()
    for step in range(config["steps"]):
        meshrun.report({"step": step, "sum": int(total) * config["scale"], "world": ctx.get_world_size(), "devices": jax.device_count()})


if __name__ == "__main__":
    result = meshrun.Trainer(
        train,
        train_loop_config={"scale": 3, "steps": 3},
        scaling_config=meshrun.ScalingConfig(num_workers=2, devices_per_worker=2),
        run_config=meshrun.RunConfig(name="fit", storage_path=sys.argv[1]),
    ).fit()
    print(json.dumps({"error": None if result.error is None else str(result.error), "status": result.status, "metrics": result.metrics, "path": result.path}))
