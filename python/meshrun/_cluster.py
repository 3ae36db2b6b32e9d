"""Lets an unmodified ``jax.distributed.initialize()`` join a meshrun run.

JAX finds its process count and id through ``ClusterEnv`` subclasses, which
register themselves when defined. meshrun defines one in every worker it
starts and puts it first, ahead of Slurm or Open MPI environments that may
also be visible, because meshrun is what placed this process.
"""

from __future__ import annotations

import os
import socket
import time


def wait_for_coordinator(address: str, timeout: float = 300.0) -> None:
    """Blocks until the JAX coordinator at ``address`` accepts connections.

    Ranks other than 0 call this before connecting: JAX's client, when it
    finds the service not yet up, backs off for about a second before trying
    again, which made one launch in two a second slower. Polling the port
    every few milliseconds costs nothing and removes that wait.
    """
    if int(os.environ.get("MESHRUN_RANK", "0")) == 0:
        return
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError:
            time.sleep(0.005)


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
            # The last hook JAX calls before it connects (the address itself
            # comes from JAX_COORDINATOR_ADDRESS without asking us), so the
            # wait for the coordinator lives here.
            wait_for_coordinator(os.environ["JAX_COORDINATOR_ADDRESS"])
            return int(os.environ["MESHRUN_RANK"])

        @classmethod
        def get_local_process_id(cls) -> int | None:
            # None: JAX must not narrow a worker to one device; meshrun has
            # already given it its devices (CPU count or CUDA_VISIBLE_DEVICES).
            return None

    types = ClusterEnv._cluster_types
    types.remove(MeshrunCluster)
    types.insert(0, MeshrunCluster)
    _cache_from_every_process()
    return True


def _cache_from_every_process() -> None:
    """Lets every process write its own persistent compilation cache entries
    on CPU.

    JAX writes cache entries from process 0 only, assuming every process
    compiles the same executable under the same key. That holds on GPU (JAX
    strips the device assignment from the key there) but not on CPU, where
    each process's key differs: ranks other than 0 then miss the cache on
    every restart and recompile while rank 0 waits for them in the first
    collective (measured: a restart's first GPT step 7.5 s later than with
    this). Keys differ, so processes never write the same entry. If JAX's
    internals change shape, this does nothing and restarts just compile
    (tests/test_recovery.py checks that rank 1 hits the cache on a restart).
    """
    try:
        from jax._src import compilation_cache, compiler, distributed
    except ImportError:
        return
    original = getattr(compiler, "_cache_write", None)
    if original is None or getattr(original, "_meshrun", False):
        return

    def cache_write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
        if distributed.global_state.process_id == 0 or host_callbacks or backend.platform != "cpu":
            return original(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks)
        try:
            compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend, int(compile_time_secs))
        except Exception:  # a cache that cannot be written only costs a compile
            pass
        return None

    cache_write._meshrun = True  # type: ignore[attr-defined]
    compiler._cache_write = cache_write
