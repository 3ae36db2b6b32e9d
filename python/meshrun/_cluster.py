"""Lets an unmodified ``jax.distributed.initialize()`` join a meshrun run.

JAX finds its process count and id through ``ClusterEnv`` subclasses, which
register themselves when defined. meshrun defines one in every worker it
starts and puts it first, ahead of Slurm or Open MPI environments that may
also be visible, because meshrun is what placed this process.
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
import sys
import time
from typing import Any

from meshrun import _jax_private


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
    _jax_private.cache_from_every_process()
    _jax_private.gloo_on_host_address()
    return True


def _contradictions(given: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(argument, value given, value meshrun uses) for every explicit
    argument to ``initialize`` that contradicts where meshrun placed this
    process."""
    run = {
        "coordinator_address": os.environ["JAX_COORDINATOR_ADDRESS"],
        "num_processes": int(os.environ["MESHRUN_WORLD_SIZE"]),
        "process_id": int(os.environ["MESHRUN_RANK"]),
    }
    found = [(name, given[name], ours) for name, ours in run.items() if given.get(name) is not None and given[name] != ours]
    ids = given.get("local_device_ids")
    gpus = os.environ.get("MESHRUN_GPUS")
    if ids is not None and gpus:
        # Ids count from 0 within the GPUs meshrun made visible; on CPU JAX
        # ignores them, so they contradict nothing there.
        wanted = [ids] if isinstance(ids, int) else list(ids)
        count = len(gpus.split(","))
        if len(set(wanted)) != len(wanted) or any(not 0 <= i < count for i in wanted):
            found.append(("local_device_ids", ids, None))
    return found


def make_initialize_agree() -> None:
    """Replaces explicit arguments to ``jax.distributed.initialize`` that
    contradict the run with meshrun's, saying so on stderr.

    JAX's own multi-process example passes the coordinator, the process
    count and id from its command line; started by meshrun, every rank
    would pass the same ones and the run would hang without a word. With
    this the script runs unchanged as one program."""
    import jax

    original = jax.distributed.initialize
    if getattr(original, "_meshrun_agrees", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # JAX says what is wrong
        found = _contradictions(bound.arguments)
        if not found:
            # Exactly the call the program made: going through the rebuilt
            # call and a second wait for the coordinator here measured 8%
            # slower steps of the demo GPT (bench/step_parity.py).
            return original(*args, **kwargs)
        for name, _, ours in found:
            bound.arguments[name] = ours
        changes = ", ".join(f"{name} {given!r} -> {'all of its GPUs' if ours is None else repr(ours)}" for name, given, ours in found)
        sys.stderr.write(
            f"meshrun: warning: jax.distributed.initialize() was given arguments that contradict where "
            f"meshrun placed this process; using meshrun's: {changes}\n"
        )
        sys.stderr.flush()
        if bound.arguments.get("process_id") is not None:
            # JAX will not ask meshrun's ClusterEnv, whose hook waits for
            # the coordinator, so wait here.
            wait_for_coordinator(bound.arguments.get("coordinator_address") or os.environ["JAX_COORDINATOR_ADDRESS"])
        return original(*bound.args, **bound.kwargs)

    initialize._meshrun_agrees = True  # type: ignore[attr-defined]
    jax.distributed.initialize = initialize


_join_checked = False


def warn_if_not_joined() -> None:
    """Warns once, from rank 0, when a run of several processes uses JAX
    without ``jax.distributed``: each process is then a program of its own,
    which a user who forgot ``initialize()`` would otherwise never learn.

    Called at every report until it can tell, and at the end. "Uses JAX"
    means its backend is up: meshrun's worker code imports JAX itself, and
    a program may report before it joins, but never computes before it.
    ``MESHRUN_INDEPENDENT=1`` says independent programs are intended."""
    global _join_checked
    if _join_checked:
        return
    if (
        os.environ.get("MESHRUN_RANK") != "0"
        or int(os.environ.get("MESHRUN_WORLD_SIZE", "1")) < 2
        or os.environ.get("MESHRUN_INDEPENDENT") == "1"
    ):
        _join_checked = True
        return
    if "jax" not in sys.modules:
        return
    try:
        import jax
        joined = jax.distributed.is_initialized()
        used = _jax_private.backends_are_initialized()
    except Exception:  # another JAX's internals; this runs on failure paths too: never raise
        _join_checked = True
        return
    if joined or not used:
        _join_checked = joined
        return
    _join_checked = True
    n = os.environ["MESHRUN_WORLD_SIZE"]
    sys.stderr.write(
        f"meshrun: warning: rank 0 of {n} never called jax.distributed.initialize() before using JAX, so the {n} "
        f"processes run as {n} independent programs, not one; call it (or meshrun.init()) first, or set "
        "MESHRUN_INDEPENDENT=1 if that is intended\n"
    )
    sys.stderr.flush()
