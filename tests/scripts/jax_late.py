"""Says whether JAX (or numpy) was imported before the program's own code, then
imports it and says whether meshrun wired it (its ClusterEnv first in
JAX's order, ``jax.distributed.initialize`` timed), and joins the run."""

import json
import os
import sys
from pathlib import Path

before = "jax" in sys.modules
numpy_before = "numpy" in sys.modules
import jax  # noqa: E402

from jax._src.clusters import ClusterEnv  # noqa: E402

wired = ClusterEnv._cluster_types[0].name == "meshrun" and getattr(jax.distributed.initialize, "_meshrun_timed", False)
jax.distributed.initialize()
out = {"jax_before": before, "numpy_before": numpy_before, "wired": wired, "process_count": jax.process_count()}
Path(os.environ["MESHRUN_STORAGE_DIR"], f"late-{os.environ['MESHRUN_RANK']}.json").write_text(json.dumps(out))
