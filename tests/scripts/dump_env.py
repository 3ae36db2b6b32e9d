# Writes this worker's environment contract to the run directory, without
# starting any JAX backend (so it also works for GPU assignments on a
# machine without GPUs).
import hashlib
import json
import os

keys = [k for k in os.environ if k.startswith(("MESHRUN_", "JAX_", "XLA_", "CUDA_"))]
env = {k: os.environ[k] for k in keys}
# The worker's credential is reported by length and by a digest, never
# written whole; the run token must not be here at all.
key = env.pop("MESHRUN_WORKER_KEY")
env["worker_key_length"] = len(key)
env["worker_key_digest"] = hashlib.sha256(key.encode()).hexdigest()
rank = os.environ["MESHRUN_RANK"]
with open(os.path.join(os.environ["MESHRUN_STORAGE_DIR"], f"env-{rank}.json"), "w") as f:
    json.dump(env, f)
