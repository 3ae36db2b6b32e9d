# Says where its coordinator will listen before joining, then waits for a
# go file (at most 60 s) before `jax.distributed.initialize()`: the window
# in which another process could take the coordinator's port.
import os
import time

here = os.environ["MESHRUN_STORAGE_DIR"]
rank = os.environ["MESHRUN_RANK"]
if rank == "0":
    with open(os.path.join(here, "coordinator.tmp"), "w") as f:
        f.write(os.environ["MESHRUN_COORDINATOR"])
    os.replace(os.path.join(here, "coordinator.tmp"), os.path.join(here, "coordinator"))
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(here, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)

import jax  # noqa: E402

jax.distributed.initialize()
open(os.path.join(here, f"ready-{jax.process_index()}"), "w").close()
time.sleep(300)
