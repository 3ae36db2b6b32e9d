# JAX's own multi-process example passes the coordinator, process count and
# id on its command line; run unchanged under meshrun, every rank passes
# the same ones. meshrun must replace them with the run's.
import sys

import jax

jax.distributed.initialize("localhost:10000", 1, 0)
sys.stdout.write(f"process {jax.process_index()} of {jax.process_count()}\n")
sys.stdout.flush()
