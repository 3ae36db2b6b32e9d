"""Lets an unmodified ``jax.distributed.initialize()`` join a meshrun run.

JAX finds its process count and id through ``ClusterEnv`` subclasses, which
register themselves when defined. meshrun defines one in every worker it
starts and puts it first, ahead of Slurm or Open MPI environments that may
also be visible, because meshrun is what placed this process.
"""

from __future__ import annotations

import os


def register() -> bool:
    """Registers meshrun's cluster environment with JAX; False without JAX."""
    try:
        from jax._src.clusters import ClusterEnv
    except ImportError:
        return False

    class MeshrunCluster(ClusterEnv):
        name = "meshrun"
        opt_in_only_method = False

        @classmethod
        def is_env_present(cls) -> bool:
            return "MESHRUN_RANK" in os.environ and "JAX_COORDINATOR_ADDRESS" in os.environ

        @classmethod
        def get_coordinator_address(cls, timeout_secs, override_coordinator_port=None) -> str:
            address = os.environ["JAX_COORDINATOR_ADDRESS"]
            if override_coordinator_port:
                address = f"{address.rsplit(':', 1)[0]}:{override_coordinator_port}"
            return address

        @classmethod
        def get_process_count(cls) -> int:
            return int(os.environ["MESHRUN_WORLD_SIZE"])

        @classmethod
        def get_process_id(cls) -> int:
            return int(os.environ["MESHRUN_RANK"])

        @classmethod
        def get_local_process_id(cls) -> int | None:
            # None: JAX must not narrow a worker to one device; meshrun has
            # already given it its devices (CPU count or CUDA_VISIBLE_DEVICES).
            return None

    types = ClusterEnv._cluster_types
    types.remove(MeshrunCluster)
    types.insert(0, MeshrunCluster)
    return True
