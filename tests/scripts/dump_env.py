# Writes this worker's environment contract to the run directory, without
# starting any JAX backend (so it also works for GPU assignments on a
# machine without GPUs).
import hashlib
import json
import os

# meshrun's own variables, and those of the launchers it speaks for.
LAUNCHERS = {"PROCESS_ID", "NUM_PROCESSES", "COORDINATOR_ADDRESS", "COORDINATOR_PORT", "JOB_INDEX", "JOB_COMPLETION_INDEX",
             "PROCESSES_IN_JOB", "NNODES", "NODE_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"}
keys = [k for k in os.environ if k.startswith(("MESHRUN_", "JAX_", "XLA_", "CUDA_")) or k in LAUNCHERS]
env = {k: os.environ[k] for k in keys}
# The worker's credential is reported by length and by a digest, never
# written whole; the run token must not be here at all.
key = env.pop("MESHRUN_WORKER_KEY")
env["worker_key_length"] = len(key)
env["worker_key_digest"] = hashlib.sha256(key.encode()).hexdigest()
rank = os.environ["MESHRUN_RANK"]
with open(os.path.join(os.environ["MESHRUN_STORAGE_DIR"], f"env-{rank}.json"), "w") as f:
    json.dump(env, f)
