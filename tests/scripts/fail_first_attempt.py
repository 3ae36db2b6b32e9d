# Rank 1 exits with status 3 in the first attempt; every rank succeeds in
# the next. No JAX: a failure and a restart in about a second.
import os
import sys

if os.environ["MESHRUN_ATTEMPT"] == "1" and os.environ["MESHRUN_RANK"] == "1":
    sys.exit(3)
print(f"rank {os.environ['MESHRUN_RANK']} done in attempt {os.environ['MESHRUN_ATTEMPT']}", flush=True)
