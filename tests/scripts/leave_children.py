# Starts three children that would outlive it (one in its process group,
# one in a process group of its own, one in a session of its own), writes
# their pids to children-<rank> in the run directory, then ends. With
# FAIL_RANK=R, rank R exits 1 once every rank has written its file, and
# the other ranks wait to be stopped.
import os
import subprocess
import sys
import time

run_dir = os.environ["MESHRUN_STORAGE_DIR"]
rank = int(os.environ["MESHRUN_RANK"])
world = int(os.environ["MESHRUN_WORLD_SIZE"])
kids = [
    subprocess.Popen(["sleep", "300"]),
    subprocess.Popen(["sleep", "300"], process_group=0),
    subprocess.Popen(["sleep", "300"], start_new_session=True),
]
path = os.path.join(run_dir, f"children-{rank}")
with open(path + ".tmp", "w") as f:
    f.write(" ".join(str(k.pid) for k in kids))
os.replace(path + ".tmp", path)

fail_rank = os.environ.get("FAIL_RANK")
if fail_rank is None:
    sys.exit(0)
if rank == int(fail_rank):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
        os.path.exists(os.path.join(run_dir, f"children-{r}")) for r in range(world)
    ):
        time.sleep(0.02)
    sys.exit(1)
time.sleep(300)
