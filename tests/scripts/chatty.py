# Rank 0 prints about CHATTY_RATE bytes a second for CHATTY_SECONDS, each
# line numbered, then says how many it printed; the other ranks wait.
import os
import sys
import time

rank = int(os.environ["MESHRUN_RANK"])
seconds = float(os.environ.get("CHATTY_SECONDS", "12"))
rate = int(os.environ.get("CHATTY_RATE", "100000"))
if rank == 0:
    filler = "x" * 90
    lines, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(rate // 10_000):  # 100-byte lines, 100 rounds a second
            print(f"{lines:08d} {filler}")
            lines += 1
        time.sleep(0.01)
    print(f"printed {lines} lines", flush=True)
else:
    time.sleep(seconds)
sys.exit(0)
