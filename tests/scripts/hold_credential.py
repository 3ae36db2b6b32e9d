# Writes what this worker holds (its credential, and whether the run token
# reached it) to the storage, then waits for the test to let it end. No JAX:
# the test is about the control plane.
import json
import os
import time

storage = os.environ["MESHRUN_STORAGE_DIR"]
rank = os.environ["MESHRUN_RANK"]
held = {"key": os.environ.get("MESHRUN_WORKER_KEY"), "token_here": "MESHRUN_TOKEN" in os.environ}
with open(os.path.join(storage, f"cred-{rank}.json.tmp"), "w") as f:
    json.dump(held, f)
os.replace(os.path.join(storage, f"cred-{rank}.json.tmp"), os.path.join(storage, f"cred-{rank}.json"))
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(storage, "release")) and time.monotonic() < deadline:
    time.sleep(0.05)
