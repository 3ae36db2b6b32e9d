# Independent programs (no jax.distributed) of uneven length: rank 0 ends
# at once, rank 1 works on for 4 s without a report. Nobody waits for
# anybody, so this is no hang, whatever --finish-timeout says.
import os
import time

if os.environ["MESHRUN_RANK"] == "1":
    time.sleep(4)
print("done", flush=True)
