# Independent programs (no jax.distributed) of uneven length: rank 0 ends
# at once, rank 1 works on without a report until 6 s after rank 0's
# process is gone. Nobody waits for anybody, so this is no hang, whatever
# --finish-timeout says once rank 0 has exited. (Rank 1 waits for rank 0's
# exit first: a finished rank still alive, as in JAX's shutdown barrier,
# does hold the others to the finish timeout, and a loaded machine can
# take seconds to end an interpreter.)
import os
import time

storage = os.environ["MESHRUN_STORAGE_DIR"]
if os.environ["MESHRUN_RANK"] == "0":
    with open(os.path.join(storage, "rank-0.pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(storage, "rank-0.pid.tmp"), os.path.join(storage, "rank-0.pid"))
else:
    pid_file = os.path.join(storage, "rank-0.pid")
    deadline = time.monotonic() + 60
    while not os.path.exists(pid_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(open(pid_file).read())
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    time.sleep(6)
print("done", flush=True)
