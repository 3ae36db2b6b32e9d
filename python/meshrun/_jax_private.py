"""Every use of JAX's private modules (``jax._src``), in one place.

meshrun runs in the user's environment with the user's JAX, so each hook
here checks the shape of what it wraps and, where that shape is not one it
knows, leaves JAX as it is rather than guess.
"""

from __future__ import annotations

import inspect
import os
from typing import Any


def backends_are_initialized() -> bool:
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def gloo_on_host_address() -> None:
    """Makes JAX's CPU collectives (gloo) listen on this host's address.

    Left alone, gloo advertises the address its host name resolves to,
    which on many machines is a loopback address (Debian maps the host name
    to 127.0.1.1; containers often to 127.0.0.1): processes on other hosts
    then dial their own loopback and the first collective times out.
    meshrun knows the address this host reached the controller from
    (``MESHRUN_HOST_IP``), so gloo is bound there, as ``GLOO_SOCKET_IFNAME``
    would do by hand."""
    host_ip = os.environ.get("MESHRUN_HOST_IP")
    if not host_ip:
        return
    import dataclasses

    from jax._src import config, distributed, xla_bridge
    from jax._src.lib import _jax

    registered = xla_bridge._backend_factories.get("cpu")
    if registered is None or getattr(registered.factory, "_meshrun_gloo", False):
        return
    original = registered.factory

    def make_cpu_client(collectives: Any = None) -> Any:
        if collectives is None and distributed.global_state.client is not None and config.cpu_collectives_implementation.value == "gloo":
            collectives = _jax.make_gloo_tcp_collectives(distributed_client=distributed.global_state.client, hostname=host_ip)
        return original(collectives)

    make_cpu_client._meshrun_gloo = True  # type: ignore[attr-defined]
    xla_bridge._backend_factories["cpu"] = dataclasses.replace(registered, factory=make_cpu_client)


_CACHE_WRITE_ARGS = ("cache_key", "compile_time_secs", "module_name", "backend", "executable", "host_callbacks")


def cache_from_every_process() -> None:
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
    # The wrapper below calls it as JAX 0.10 declares it; another JAX may
    # take other arguments (0.11 does), and is then left as it is.
    if list(inspect.signature(original).parameters) != list(_CACHE_WRITE_ARGS):
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
