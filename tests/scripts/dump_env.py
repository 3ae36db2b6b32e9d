# Writes this worker's environment contract to the run directory, without
# starting any JAX backend (so it also works for GPU assignments on a
# machine without GPUs).
import json
import os

keys = [k for k in os.environ if k.startswith(("MESHRUN_", "JAX_", "XLA_", "CUDA_"))]
env = {k: os.environ[k] for k in keys}
env.pop("MESHRUN_TOKEN")
env["token_length"] = len(os.environ["MESHRUN_TOKEN"])
rank = os.environ["MESHRUN_RANK"]
with open(os.path.join(os.environ["MESHRUN_STORAGE_DIR"], f"env-{rank}.json"), "w") as f:
    json.dump(env, f)
