# Reports a falling loss every INTERVAL seconds (default 0.3) for STEPS steps
# (default 50), without JAX: a run that a watcher sees grow.
import sys
import time

import meshrun

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
interval = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
for step in range(1, steps + 1):
    meshrun.report({"step": step, "loss": 2.0 / step**0.5})
    time.sleep(interval)
