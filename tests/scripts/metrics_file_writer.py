# A program that never calls meshrun.report: like MaxText, its process 0
# appends one JSON object a step to a metrics file of its own.
import json
import os
import sys
import time

path, steps = sys.argv[1], int(sys.argv[2])
for step in range(steps):
    print(f"completed step: {step}", flush=True)
    if os.environ["MESHRUN_RANK"] == "0":
        with open(path, "a") as f:
            if step == 2:
                f.write("not json\n")
            f.write(json.dumps({"step": step, "learning/loss": 10.0 - step, "learning/grad_norm": 1.5, "note": "text"}) + "\n")
    time.sleep(0.3)
