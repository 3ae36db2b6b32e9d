# Prints and reports until the runs directory's small file system is full.
import time

import meshrun

for i in range(200):
    print("x" * 10000, flush=True)
    meshrun.report({"step": i, "loss": 1.0 / (i + 1)})
    time.sleep(0.02)
