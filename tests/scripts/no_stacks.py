# Rank 0 ignores SIGUSR1 (so it writes no stacks when the group is
# stopped) and waits; rank 1 ends with status 3 once rank 0 ignores it
# (on a busy machine rank 0 may still be starting 0.5 s in, when meshrun's
# own handler would write its stacks).
import os
import signal
import time
from pathlib import Path

ready = Path(os.environ["MESHRUN_STORAGE_DIR"]) / "rank-0-ignores-sigusr1"
if os.environ["MESHRUN_RANK"] == "1":
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(3)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
ready.touch()
time.sleep(120)
