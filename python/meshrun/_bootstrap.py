"""Entry point of every worker: ``python -m meshrun._bootstrap KIND TARGET [ARGS]``.

KIND is ``script`` (a path), ``module`` (a dotted name) or ``function`` (a
cloudpickled ``(fn, config)`` file, named relative to the run's scratch
folder on this host, where the agent wrote what the controller sent). The
worker joins the run, then runs the target as Python itself would
(``__main__``, ``sys.argv``, ``sys.path[0]``).

meshrun's JAX side (its cluster environment, ``jax.distributed.initialize``
made to agree with the run, the compile timing and the flight recorder) is
wired when the program first imports JAX, right after JAX's own import: a
program that never imports it (a shell step, embarrassingly parallel
Python) does not pay JAX's import, most of a second of CPU per worker.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import traceback
from collections.abc import Callable
from types import ModuleType

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


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then`` once, right after the module ``name`` is first imported
    (its own code has run, before the importer gets it). The import and
    ``then`` count as the worker's start-up in the run's goodput, as they
    did when the worker imported JAX before the program."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec  # not importable here: the import fails as it would have
        exec_module = loader.exec_module
        then = self.then

        def exec_then(module: ModuleType) -> None:
            with _goodput.timed("init"):
                exec_module(module)
                then()

        loader.exec_module = exec_then  # type: ignore[method-assign]
        return spec


def _after_import(name: str, then: Callable[[], None]) -> None:
    """``then`` once ``name`` is imported: at once where it already is (a
    warm spare imports JAX ahead of its attempt)."""
    if name in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def _wire_jax() -> None:
    if _cluster.register():
        _cluster.make_initialize_agree()
        _goodput.watch_jax()
        _recorder.install()


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
    _after_import("jax", _wire_jax)
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
