# Reports a step every 50 ms, without JAX, then writes how many it sent.
import os
import sys
import time

import meshrun

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
for step in range(1, steps + 1):
    meshrun.report({"step": step, "loss": 1.0 / step})
    time.sleep(0.05)
with open(os.path.join(os.environ["MESHRUN_STORAGE_DIR"], f"sent-{os.environ['MESHRUN_RANK']}"), "w") as f:
    f.write(str(steps))
