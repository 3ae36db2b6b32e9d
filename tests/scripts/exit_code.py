import os
import sys
import time

if os.environ["MESHRUN_RANK"] == "1":
    print("rank 1 giving up", flush=True)
    sys.exit(3)
time.sleep(120)
