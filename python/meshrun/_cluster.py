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

from meshrun import _executables, _jax_private
from meshrun._native import ENV


def coordinator() -> str:
    """The JAX coordinator's ``host:port``, from meshrun's own variable.

    Never from ``JAX_COORDINATOR_ADDRESS``: that one is a launcher's
    convention (meshrun sets it to the bare host, for MaxText), and
    programs and launch shims change it."""
    return os.environ[ENV["coordinator"]]


def _host(address: str) -> str:
    """The host of ``host:port`` or of a bare host, without IPv6 brackets."""
    if address.startswith("["):
        return address[1 : address.index("]")] if "]" in address else address
    if address.count(":") == 1:
        return address.split(":")[0]
    return address


_coordinator_seen: str | None = None


def wait_for_coordinator(address: str, timeout: float = 300.0) -> None:
    """Blocks until the JAX coordinator at ``address`` accepts connections.

    Ranks other than 0 call this before connecting: JAX's client, when it
    finds the service not yet up, backs off for about a second before trying
    again, which made one launch in two a second slower. Polling the port
    every few milliseconds costs nothing and removes that wait.
    """
    global _coordinator_seen
    if int(os.environ.get(ENV["rank"], "0")) == 0 or _coordinator_seen == address:
        return
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                # Once: meshrun.init() waits, then its initialize() call
                # comes through the wrapper, which would connect again.
                _coordinator_seen = address
                return
        except OSError:
            time.sleep(0.005)


def register() -> bool:
    """Registers meshrun's cluster environment with JAX; False without JAX."""
    # Any: a base class found at runtime, which mypy cannot check a subclass against.
    ClusterEnv: Any = _jax_private.cluster_env_base()
    if ClusterEnv is None:
        return False

    class MeshrunCluster(ClusterEnv):
        name = "meshrun"
        opt_in_only_method = False

        @classmethod
        def is_env_present(cls) -> bool:
            return ENV["rank"] in os.environ and ENV["coordinator"] in os.environ

        @classmethod
        def get_coordinator_address(cls, timeout_secs, override_coordinator_port=None) -> str:
            # The override is JAX_COORDINATOR_PORT, which meshrun sets for
            # MaxText and a program may change: the run's port is meshrun's.
            return coordinator()

        @classmethod
        def get_process_count(cls) -> int:
            return int(os.environ[ENV["world_size"]])

        @classmethod
        def get_process_id(cls) -> int:
            # The last hook JAX calls before it connects (the address itself
            # comes from meshrun's initialize, without asking us), so the
            # wait for the coordinator lives here.
            wait_for_coordinator(coordinator())
            return int(os.environ[ENV["rank"]])

        @classmethod
        def get_local_process_id(cls) -> int | None:
            # None: JAX must not narrow a worker to one device; meshrun has
            # already given it its devices (CPU count or CUDA_VISIBLE_DEVICES).
            return None

    _jax_private.put_cluster_env_first(MeshrunCluster)
    _jax_private.cache_from_every_process()
    _jax_private.gloo_on_host_address()
    return True


def _contradictions(given: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(argument, value given, value meshrun uses) for every explicit
    argument to ``initialize`` that contradicts where meshrun placed this
    process."""
    run = {
        "coordinator_address": coordinator(),
        "num_processes": int(os.environ[ENV["world_size"]]),
        "process_id": int(os.environ[ENV["rank"]]),
    }
    found = [(name, given[name], ours) for name, ours in run.items() if given.get(name) is not None and given[name] != ours]
    ids = given.get("local_device_ids")
    gpus = os.environ.get(ENV["gpus"])
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
        given = bound.arguments
        found = _contradictions(given)
        if given.get("coordinator_address") is None:
            # JAX would read JAX_COORDINATOR_ADDRESS, which holds the bare
            # host (MaxText's convention) or whatever the program set:
            # meshrun passes the run's own address instead.
            in_env = os.environ.get("JAX_COORDINATOR_ADDRESS")
            given["coordinator_address"] = coordinator()
            if in_env and _host(in_env) != _host(coordinator()):
                found.append(("coordinator_address (from JAX_COORDINATOR_ADDRESS)", in_env, coordinator()))
        for name, _, ours in found:
            given[name.split(" ")[0]] = ours
        # A coordinator on the run's host at another port is a launcher's
        # fixed port (MaxText's CPU path always says 1234): replaced
        # without a word. Anything else is said once per rank.
        told = [(n, g, o) for n, g, o in found if not (n == "coordinator_address" and _host(str(g)) == _host(coordinator()))]
        if told:
            changes = ", ".join(f"{name} {g!r} -> {'all of its GPUs' if o is None else repr(o)}" for name, g, o in told)
            sys.stderr.write(
                f"meshrun: warning: jax.distributed.initialize() was given arguments that contradict where "
                f"meshrun placed this process; using meshrun's: {changes}\n"
            )
            sys.stderr.flush()
        if given.get("process_id") is not None:
            # JAX will not ask meshrun's ClusterEnv, whose hook waits for
            # the coordinator, so wait here.
            wait_for_coordinator(coordinator())
        joined = original(*bound.args, **bound.kwargs)
        # A restart's executables load while the program goes on.
        _executables.prefetch()
        return joined

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
        os.environ.get(ENV["rank"]) != "0"
        or int(os.environ.get(ENV["world_size"], "1")) < 2
        or os.environ.get(ENV["independent"]) == "1"
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
    n = os.environ[ENV["world_size"]]
    sys.stderr.write(
        f"meshrun: warning: rank 0 of {n} never called jax.distributed.initialize() before using JAX, so the {n} "
        f"processes run as {n} independent programs, not one; call it (or meshrun.init()) first, or set "
        "MESHRUN_INDEPENDENT=1 if that is intended\n"
    )
    sys.stderr.flush()
