# Reports step 3 with its state to save and raises at once (attempt 1);
# the restart reports the step it resumed from. One process.
# python raise_after_save.py
import numpy as np

import meshrun

ctx = meshrun.init()
ckpt = meshrun.get_checkpoint()
if ckpt is None:
    meshrun.report({"step": 3}, checkpoint={"w": np.arange(4, dtype=np.float32)})
    raise RuntimeError("right after a save")
state = meshrun.restore({"w": np.zeros(4, np.float32)}, ckpt)
meshrun.report({"step": ckpt.step + 1, "resumed_from": ckpt.step, "w": float(state["w"].sum())})
