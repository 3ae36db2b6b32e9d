# Joins the run, says so in a file, then waits to be stopped.
import os
import time

import jax

jax.distributed.initialize()
open(os.path.join(os.environ["MESHRUN_STORAGE_DIR"], f"ready-{jax.process_index()}"), "w").close()
time.sleep(300)
