"""Where this process stands in the run: :func:`get_context` and :func:`init`.

Everything is read from the environment contract that meshrun's agent sets
before the worker starts, so it works the same whatever placed the worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from meshrun._cluster import wait_for_coordinator

__all__ = ["Context", "get_context", "init"]


@dataclass(frozen=True)
class Context:
    """This worker's place in the run. Outside meshrun: one process, rank 0."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host_rank: int
    num_hosts: int
    run_dir: str | None
    run_id: str | None
    attempt: int
    coordinator_address: str | None
    #: Save a checkpoint passed to ``report`` only at multiples of this step.
    checkpoint_every: int | None = None
    #: The run's folder in the storage every host reaches: its checkpoints.
    storage_dir: str | None = None
    #: Also keep the state in host memory at multiples of this step.
    memory_every: int | None = None
    #: Elastic runs (``--hosts MIN:MAX``): the fewest and most processes an
    #: attempt may have (both ``world_size`` otherwise).
    min_world_size: int | None = None
    max_world_size: int | None = None
    #: The previous attempt's world size (elastic runs, from the second
    #: attempt), and why this one's differs (``None``: it does not).
    previous_world_size: int | None = None
    resize_reason: str | None = None

    # Ray Train's names, for users moving over.
    def get_world_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.host_rank

    @property
    def in_meshrun(self) -> bool:
        return self.run_dir is not None

    @property
    def resized(self) -> bool:
        """This attempt runs on another world size than the one before it
        (or, the first of an elastic run, on fewer than the most)."""
        return self.resize_reason is not None


def _int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None else int(value)


def _opt_int(name: str) -> int | None:
    value = os.environ.get(name)
    return None if value is None else int(value)


def get_context() -> Context:
    """The current worker's context."""
    return Context(
        rank=_int("MESHRUN_RANK", 0),
        world_size=_int("MESHRUN_WORLD_SIZE", 1),
        local_rank=_int("MESHRUN_LOCAL_RANK", 0),
        local_world_size=_int("MESHRUN_LOCAL_WORLD_SIZE", 1),
        host_rank=_int("MESHRUN_HOST_RANK", 0),
        num_hosts=_int("MESHRUN_NUM_HOSTS", 1),
        run_dir=os.environ.get("MESHRUN_RUN_DIR"),
        run_id=os.environ.get("MESHRUN_RUN_ID"),
        attempt=_int("MESHRUN_ATTEMPT", 1),
        coordinator_address=os.environ.get("MESHRUN_COORDINATOR"),
        checkpoint_every=int(os.environ["MESHRUN_CHECKPOINT_EVERY"]) if "MESHRUN_CHECKPOINT_EVERY" in os.environ else None,
        storage_dir=os.environ.get("MESHRUN_STORAGE_DIR", os.environ.get("MESHRUN_RUN_DIR")),
        memory_every=_opt_int("MESHRUN_MEMORY_EVERY"),
        min_world_size=_opt_int("MESHRUN_MIN_WORLD_SIZE"),
        max_world_size=_opt_int("MESHRUN_MAX_WORLD_SIZE"),
        previous_world_size=_opt_int("MESHRUN_PREVIOUS_WORLD_SIZE"),
        resize_reason=os.environ.get("MESHRUN_RESIZE_REASON"),
    )


def init() -> Context:
    """Joins ``jax.distributed`` with this worker's coordinates and returns
    the context. Idempotent; outside meshrun it initializes nothing."""
    ctx = get_context()
    if ctx.in_meshrun and ctx.world_size > 1:
        import jax

        if not jax.distributed.is_initialized():
            assert ctx.coordinator_address is not None  # the agent sets it with MESHRUN_RUN_DIR
            wait_for_coordinator(ctx.coordinator_address)
            jax.distributed.initialize(
                coordinator_address=ctx.coordinator_address,
                num_processes=ctx.world_size,
                process_id=ctx.rank,
            )
    return ctx
