"""meshrun's code inside every worker: what happens when the program ends.

:mod:`meshrun._bootstrap` connects (:mod:`meshrun._connection`) before the
user's program, then calls :func:`finish` when it ends normally, or reports
an uncaught exception, or a ``sys.exit`` with a non-zero code, before the
process tries to exit, since a JAX worker that ends early may otherwise wait
minutes in a shutdown barrier before anyone learns of it.
"""

from __future__ import annotations

import sys
import traceback
from types import ModuleType

from meshrun import _cluster, _connection, _goodput, _metrics_file

# How long a failing rank lets its saves under way finish before it says
# so: long enough for a slow store's upload, short next to a hang timeout.
SETTLE_SAVES_S = 30.0


def report_failure(exc: BaseException) -> None:
    """Sends the exception and its traceback; waits until it is sent. A
    save under way finishes first, so a checkpoint reported just before the
    exception is committed rather than cut off by the group's stop."""
    _cluster.warn_if_not_joined()
    if checkpoint := _used("checkpoint"):
        checkpoint._settle_writes(SETTLE_SAVES_S)
    _metrics_file.finish()
    if reporting := _used("reporting"):
        reporting._drain(wait=False)
    client = _connection.client()
    if client is None:
        return
    text = "".join(traceback.format_exception(exc))
    client.report_failure(type(exc).__qualname__, str(exc), text)


def _used(name: str) -> ModuleType | None:
    """meshrun's module ``name`` where the program imported it (itself or
    through another): a program that never did has no reports queued and
    no saves under way, and a worker that imports no more than it uses
    starts sooner (``checkpoint`` brings numpy)."""
    return sys.modules.get(f"meshrun.{name}")


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
    keep working, and its status would come too late and be a SIGABRT.
    A save under way finishes first, as for an exception."""
    _cluster.warn_if_not_joined()
    if checkpoint := _used("checkpoint"):
        checkpoint._settle_writes(SETTLE_SAVES_S)
    _metrics_file.finish()
    if reporting := _used("reporting"):
        reporting._drain(wait=False)
    client = _connection.client()
    if client is None:
        return
    text = "".join(traceback.format_exception(user_frames(exc)))
    argument = repr(exc.code)
    if len(argument) > 200:
        argument = argument[:197] + "..."
    client.report_exit(code, argument, text)


def user_frames(exc: BaseException) -> BaseException:
    """Drops meshrun's own frames (bootstrap, runpy) from the front of the
    traceback, so users see their code first, as ``python script.py`` shows it."""
    tb = exc.__traceback__
    while tb is not None and _is_meshrun_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    # Nothing of the user's ran (a SyntaxError in the script, a module that
    # is not there): the exception says it all, as ``python script.py``
    # shows it, without meshrun's frames.
    return exc.with_traceback(tb)


def _is_meshrun_frame(filename: str) -> bool:
    return filename.endswith(("meshrun/_bootstrap.py", "runpy.py")) or filename == "<frozen runpy>"


def finish() -> None:
    """The program ended normally: send what is queued, then say goodbye."""
    _cluster.warn_if_not_joined()
    _metrics_file.finish()
    if reporting := _used("reporting"):
        reporting._drain(wait=True)
    if checkpoint := _used("checkpoint"):
        checkpoint.wait()
    client = _connection.client()
    if client is not None:
        client.timing(_goodput.snapshot())
        client.close()
