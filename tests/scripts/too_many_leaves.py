# Saves a tree of 20000 tiny arrays: its shard list cannot fit one control
# message, so the save must fail with a CheckpointError that says so.
import numpy as np

import meshrun

meshrun.init()
tree = {f"param_{i:05d}": np.zeros(2, np.float32) for i in range(20000)}
meshrun.save(1, tree)
try:
    meshrun.checkpoint.wait()
except meshrun.CheckpointError as e:
    print("refused:", e)
else:
    raise SystemExit("a save too large for a control message was accepted")
