"""Entry point of every worker: ``python -m meshrun._bootstrap KIND TARGET [ARGS]``.

KIND is ``script`` (a path), ``module`` (a dotted name) or ``function`` (a
cloudpickled ``(fn, config)`` file, named relative to the run's scratch
folder on this host, where the agent wrote what the controller sent). The worker joins the run, registers
meshrun's JAX cluster environment, then runs the target as Python itself
would (``__main__``, ``sys.argv``, ``sys.path[0]``).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from meshrun import _cluster, _connection, _executable_checks, _goodput, _gpu_memory, _metrics_file, _recorder, _runtime, context
from meshrun._native import ENV


def _run(kind: str, target: str, args: list[str]) -> None:
    if kind == "script":
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")
    elif kind == "module":
        sys.argv = [target, *args]
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif kind == "function":
        import cloudpickle  # only function mode needs it

        with open(os.path.join(os.environ.get(ENV["scratch"], ""), target), "rb") as f:
            fn, config = cloudpickle.load(f)
        context.init()
        if config is None:
            fn()
        else:
            fn(config)
    else:
        raise SystemExit(f"meshrun bootstrap: unknown kind {kind!r}")


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python -m meshrun._bootstrap script|module|function TARGET [ARGS...]")
    kind, target, *args = argv
    # Before anything starts JAX's backend.
    said = _gpu_memory.apply()
    if said:
        print(said, file=sys.stderr, flush=True)
    _connection.start()
    _metrics_file.follow()
    if _cluster.register():
        _cluster.make_initialize_agree()
        _goodput.watch_jax()
        _recorder.install()
    _goodput.user_code_starts()
    try:
        _run(kind, target, args)
        # A loaded executable still being checked: the program's results
        # stand only once it is (see meshrun._executable_checks).
        _executable_checks.settle()
    except SystemExit as exc:
        code = _runtime.exit_code(exc)
        if code == 0:
            _runtime.finish()
        else:
            # A failure like an exception, told before the exit, which JAX's
            # shutdown barrier can hold for minutes.
            _runtime.report_exit(exc, code)
        raise
    except BaseException as exc:
        exc = _runtime.user_frames(exc)
        traceback.print_exception(exc)
        sys.stderr.flush()
        _runtime.report_failure(exc)
        # A normal exit, so atexit handlers run; if JAX then waits in its
        # shutdown barrier, the controller (already told) stops the group.
        sys.exit(1)
    else:
        _runtime.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
