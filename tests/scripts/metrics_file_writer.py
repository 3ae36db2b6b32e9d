# A program that never calls meshrun.report: like MaxText, each of its
# processes appends one JSON object a step to the same metrics file.
import json
import os
import sys
import time

path, steps = sys.argv[1], int(sys.argv[2])
for step in range(steps):
    print(f"completed step: {step}", flush=True)
    rank = int(os.environ["MESHRUN_RANK"])
    with open(path, "a") as f:
        if step == 2 and rank == 0:
            f.write("not json\n")
        # The step written as a float, as MaxText writes it.
        line = {"step": float(step), "learning/loss": 10.0 - step, "learning/z_loss": 0.0, "note": "text"}
        f.write(json.dumps(line) + "\n")
    time.sleep(0.3)
