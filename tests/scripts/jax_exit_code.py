# Rank 1 joins jax.distributed, then calls sys.exit while rank 0 keeps
# working: JAX's shutdown barrier would hold rank 1 for minutes if meshrun
# only learnt of the exit from the process's status. argv[1]: the argument
# to sys.exit (an integer, else a message), 3 by default.
import sys
import time

import jax

jax.distributed.initialize()
if jax.process_index() == 1:
    arg = sys.argv[1] if len(sys.argv) > 1 else "3"
    print("rank 1 giving up", flush=True)
    sys.exit(int(arg) if arg.lstrip("-").isdigit() else arg)
time.sleep(120)
