# Rank 0 ignores SIGUSR1 (so it writes no stacks when the group is
# stopped) and waits; rank 1 ends at once with status 3.
import os
import signal
import time

if os.environ["MESHRUN_RANK"] == "1":
    time.sleep(0.5)
    os._exit(3)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
time.sleep(120)
