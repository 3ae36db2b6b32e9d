"""meshrun's code inside every worker: the connection to the controller.

Started by :mod:`meshrun._bootstrap` before the user's program, it holds the
native client (whose Rust threads send heartbeats and reports without the
GIL) and reports an uncaught exception, or a ``sys.exit`` with a non-zero
code, before the process tries to exit, since a JAX worker that ends early
may otherwise wait minutes in a shutdown barrier before anyone learns of it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import traceback
from typing import IO

from meshrun import _native

_client: _native.WorkerClient | None = None
_stacks_file: IO[str] | None = None


def client() -> _native.WorkerClient | None:
    return _client


def _stacks_on_sigusr1() -> None:
    """When meshrun stops a failed or hung attempt it first sends SIGUSR1:
    faulthandler then writes every thread's Python stack to
    ``stacks/attempt-K/rank-R.txt``, from the signal handler, so it works
    while the main thread is stuck in C (a collective, a sleep)."""
    global _stacks_file
    folder = os.path.join(os.environ["MESHRUN_RUN_DIR"], "stacks", f"attempt-{os.environ.get('MESHRUN_ATTEMPT', '1')}")
    os.makedirs(folder, exist_ok=True)
    # Kept open for the life of the process: the handler writes to its fd.
    _stacks_file = open(os.path.join(folder, f"rank-{os.environ['MESHRUN_RANK']}.txt"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=_stacks_file, all_threads=True, chain=False)


def start() -> None:
    """Connects to the controller named in the environment contract."""
    global _client
    if _client is not None or "MESHRUN_CONTROL_ADDR" not in os.environ:
        return
    _stacks_on_sigusr1()
    _client = _native.WorkerClient(
        os.environ["MESHRUN_CONTROL_ADDR"],
        os.environ["MESHRUN_TOKEN"],
        int(os.environ["MESHRUN_RANK"]),
        int(os.environ.get("MESHRUN_ATTEMPT", "1")),
    )


def report_failure(exc: BaseException) -> None:
    """Sends the exception and its traceback; waits until it is sent."""
    from meshrun import _cluster, reporting

    _cluster.warn_if_not_joined()
    reporting.drain(wait=False)
    if _client is None:
        return
    text = "".join(traceback.format_exception(exc))
    _client.report_failure(type(exc).__qualname__, str(exc), text)


def exit_code(exc: SystemExit) -> int:
    """The status ``sys.exit(arg)`` asks for, as Python decides it: ``None``
    is 0, an integer is itself, anything else (a message) is 1."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        # Beyond what the protocol carries: still a non-zero request.
        return code if -(2**31) <= code < 2**31 else 1
    return 1


def report_exit(exc: SystemExit, code: int) -> None:
    """Sends a non-zero ``sys.exit`` with where it was called; waits until it
    is sent. The controller then stops the group at once: a JAX process that
    exits waits in JAX's shutdown barrier for the others, minutes if they
    keep working, and its status would come too late and be a SIGABRT."""
    from meshrun import _cluster, reporting

    _cluster.warn_if_not_joined()
    reporting.drain(wait=False)
    if _client is None:
        return
    text = "".join(traceback.format_exception(user_frames(exc)))
    argument = repr(exc.code)
    if len(argument) > 200:
        argument = argument[:197] + "..."
    _client.report_exit(code, argument, text)


def user_frames(exc: BaseException) -> BaseException:
    """Drops meshrun's own frames (bootstrap, runpy) from the front of the
    traceback, so users see their code first, as ``python script.py`` shows it."""
    tb = exc.__traceback__
    while tb is not None and _is_meshrun_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is not None:
        exc = exc.with_traceback(tb)
    return exc


def _is_meshrun_frame(filename: str) -> bool:
    return filename.endswith(("meshrun/_bootstrap.py", "runpy.py")) or filename == "<frozen runpy>"


def finish() -> None:
    """The program ended normally: send what is queued, then say goodbye."""
    from meshrun import _cluster, reporting

    _cluster.warn_if_not_joined()
    reporting.drain(wait=True)
    from meshrun import checkpoint

    checkpoint.wait()
    if _client is not None:
        from meshrun import _goodput

        _client.timing(json.dumps(_goodput.snapshot()))
        _client.close()
