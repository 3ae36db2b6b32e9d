"""This worker's connection to its controller: the one native client.

Kept apart from :mod:`meshrun._runtime` (what happens when the program
ends) so that :mod:`meshrun.reporting` and :mod:`meshrun.checkpoint`, which
send through the client, and ``_runtime``, which drains them at the end,
import this module and not each other.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from typing import IO

from meshrun import _native
from meshrun._native import ENV

_client: _native.WorkerClient | None = None
_stacks_file: IO[str] | None = None


def client() -> _native.WorkerClient | None:
    """The connection, or None outside a run (plain ``python``)."""
    return _client


def _stacks_on_sigusr1(scratch: str, attempt: int, rank: int) -> None:
    """When meshrun stops a failed or hung attempt it first sends SIGUSR1:
    faulthandler then writes every thread's Python stack to a file in the
    run's scratch folder on this host, from the signal handler, so it works
    while the main thread is stuck in C (a collective, a sleep); the agent
    sends it on to the controller."""
    global _stacks_file
    path = _native.stacks_file(scratch, attempt, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Kept open for the life of the process: the handler writes to its fd.
    _stacks_file = open(path, "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=_stacks_file, all_threads=True, chain=False)


def start() -> None:
    """Connects to the controller named in the environment contract."""
    global _client
    if _client is not None or ENV["control_addr"] not in os.environ:
        return
    rank = int(os.environ[ENV["rank"]])
    attempt = int(os.environ.get(ENV["attempt"], "1"))
    _stacks_on_sigusr1(os.environ[ENV["scratch"]], attempt, rank)
    _client = _native.WorkerClient(os.environ[ENV["control_addr"]], os.environ[ENV["worker_key"]], rank, attempt)
