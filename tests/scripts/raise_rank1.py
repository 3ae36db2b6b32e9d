# Rank 1 raises after joining jax.distributed; rank 0 keeps going, as a real
# rank would, until meshrun stops it.
import time

import jax

jax.distributed.initialize()
if jax.process_index() == 1:
    time.sleep(0.5)
    raise ValueError("boom from rank 1")
time.sleep(120)
