"""Where this process stands in the run: :func:`get_context` and :func:`init`.

Everything is read from the environment contract that meshrun's agent sets
before the worker starts, so it works the same whatever placed the worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from meshrun._cluster import wait_for_coordinator
from meshrun._native import ENV

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
        rank=_int(ENV["rank"], 0),
        world_size=_int(ENV["world_size"], 1),
        local_rank=_int(ENV["local_rank"], 0),
        local_world_size=_int(ENV["local_world_size"], 1),
        host_rank=_int(ENV["host_rank"], 0),
        num_hosts=_int(ENV["num_hosts"], 1),
        run_dir=os.environ.get(ENV["run_dir"]),
        run_id=os.environ.get(ENV["run_id"]),
        attempt=_int(ENV["attempt"], 1),
        coordinator_address=os.environ.get(ENV["coordinator"]),
        checkpoint_every=int(os.environ[ENV["checkpoint_every"]]) if ENV["checkpoint_every"] in os.environ else None,
        storage_dir=os.environ.get(ENV["storage_dir"], os.environ.get(ENV["run_dir"])),
        memory_every=_opt_int(ENV["memory_every"]),
        min_world_size=_opt_int(ENV["min_world_size"]),
        max_world_size=_opt_int(ENV["max_world_size"]),
        previous_world_size=_opt_int(ENV["previous_world_size"]),
        resize_reason=os.environ.get(ENV["resize_reason"]),
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
