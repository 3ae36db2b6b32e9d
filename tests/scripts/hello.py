import os
import sys

print(f"hello from rank {os.environ['MESHRUN_RANK']}", flush=True)
print(f"err from rank {os.environ['MESHRUN_RANK']}", file=sys.stderr, flush=True)
