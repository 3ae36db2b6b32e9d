# No JAX: says it is ready in a file, then waits to be stopped. (A JAX worker
# would also die when its coordinator does; this one only ends if meshrun
# ends it.)
import os
import time

open(os.path.join(os.environ["MESHRUN_STORAGE_DIR"], f"ready-{os.environ['MESHRUN_RANK']}"), "w").close()
time.sleep(300)
