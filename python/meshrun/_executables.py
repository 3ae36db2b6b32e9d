"""Jitted functions whose executables travel between a run's attempts.

``meshrun.jit(f, **kw)`` is ``jax.jit(f, **kw)`` whose first call, for each
argument signature, either loads the executable an earlier attempt of the
run left on this host, or traces, lowers and compiles it and leaves it
there (serialized in the background, into the host's run folder, which
outlives the worker and goes with the run). A restarted process, or a warm
spare that takes a rank over, then skips tracing and compiling: it starts
loading its executables as soon as ``jax.distributed`` is up, alongside
the program's own start: the newest first (a program initializes, then
loops; a restart restores instead of initializing, so its first call is
to what was compiled last), the others once a first call has computed; a
first call whose executable has not begun loading loads it at once.

The file is found by a key over the function's name, jit's options, this
process's rank and the arguments' tree, shapes and dtypes; it keeps the
rest of what the executable depends on (the arguments' shardings and
devices, the process count, JAX, jaxlib and the backend), so that when any
of it differs (an elastic resize, another JAX) the function is compiled
again and the event says what differed. A damaged or truncated file is
never handed to JAX (the engine checks its length and CRC).

A name and shapes cannot prove that the function still traces to the same
program (a closure may hold a value that changed). So what is loaded is
checked: see :mod:`meshrun._executable_checks`.

``meshrun.eval_shape(f, *args)`` keeps ``jax.eval_shape``'s abstract result
the same way (the model's shapes, needed on every restart to restore into),
checked the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from meshrun import _connection, _executable_checks as checks, _goodput, _jax_private, _native, _recorder
from meshrun._native import ENV
from meshrun.errors import StorageError

__all__ = ["Jitted", "eval_shape", "jit", "prefetch"]

# Bumped when what is stored, or how the key is made, changes.
_FORMAT = 2
_STATIC = ("static_argnums", "static_argnames")
_PLACED = ("in_shardings", "out_shardings")

# Executables being loaded ahead of their first call, by key.
_prefetched: dict[str, Future[Any]] = {}
# Set once the first call of a travelling function has computed: a
# restart's prefetch loads the newest executable (its step), then the
# others only after that, which would otherwise take the cores from the
# first step (2 ranks on 2 cores: 1.5 s against 1.1 s).
_first_ran = threading.Event()


def _folder() -> str | None:
    """The run's folder on this host; None outside a run."""
    return os.environ.get(ENV["scratch"]) or None


def _event(name: str, outcome: str, seconds: float, reason: str | None) -> None:
    client = _connection.client()
    if client is not None:
        client.executable(name, outcome, seconds, reason)


def _tree_text(tree: Any) -> str:
    """A tree's structure as text, the same in every process: the repr of
    a function held in it (a Flax module's) carries its address."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", str(tree))


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _sharding(s: Any) -> Any:
    mesh = getattr(s, "mesh", None)
    if mesh is not None and hasattr(mesh, "devices"):
        return ["named", list(mesh.axis_names), list(mesh.devices.shape), [d.id for d in mesh.devices.flat], str(s.spec), s.memory_kind]
    return [type(s).__name__, repr(s)]


def _placement(shardings: Any) -> Any:
    """jit's ``in_shardings``/``out_shardings`` as plain data (devices by id)."""
    import jax

    leaves, tree = jax.tree.flatten(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    return [_tree_text(tree), [_sharding(x) for x in leaves]]


def _leaf(x: Any) -> tuple[list[Any], Any]:
    """(what the key holds, what must also match) of one argument."""
    import numpy as np

    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is not None and dtype is not None and hasattr(x, "sharding"):
        placed = x.sharding
        return ["array", list(shape), str(dtype), bool(getattr(x, "weak_type", False))], None if placed is None else _sharding(placed)
    if isinstance(x, np.ndarray | np.generic):
        return ["numpy", list(x.shape), str(x.dtype)], None
    if isinstance(x, bool | int | float | complex):
        return ["python", type(x).__name__], None
    raise TypeError(f"meshrun.jit: an argument of type {type(x).__name__} is not an array or a number; bind it with functools.partial")


def _identity() -> dict[str, Any]:
    """What an executable depends on beyond its arguments."""
    import jax
    import jaxlib

    devices = jax.devices()
    return {
        "format": _FORMAT,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": f"{devices[0].platform} {devices[0].client.platform_version}",
        "processes": jax.process_count(),
        "devices": [[d.id, d.process_index, d.device_kind] for d in devices],
    }


_WORDS = {
    "format": "meshrun's format",
    "jax": "JAX",
    "jaxlib": "jaxlib",
    "backend": "the backend",
    "processes": "the process count",
    "devices": "the devices",
    "shardings": "the arguments' shardings (another mesh)",
}


def _differs(stored: dict[str, Any], now: dict[str, Any]) -> str | None:
    """Why a stored result was made for something else, in words."""
    for field, said in _WORDS.items():
        if stored.get(field) != now.get(field):
            return f"{said} differ: {_short(stored.get(field))} when it was compiled, {_short(now.get(field))} now"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _deserialize(payload: bytes, device_ids: list[int] | None) -> Any:
    import jax
    from jax.experimental.serialize_executable import deserialize_and_load

    exe, in_tree, out_tree = pickle.loads(payload)
    by_id = {d.id: d for d in jax.devices()}
    devices = None if device_ids is None else [by_id[i] for i in device_ids]
    return deserialize_and_load(exe, in_tree, out_tree, execution_devices=devices)


def _load(folder: str, key: str, now: dict[str, Any], shardings: Any) -> tuple[Any, dict[str, Any] | None, str]:
    """(the executable or None, its meta, why not)."""
    try:
        found = _native.load_executable(folder, key)
    except StorageError as exc:
        return None, None, str(exc)
    if found is None:
        return None, None, "no executable of this function for these arguments yet"
    meta = json.loads(found[0])
    why = _differs(meta, {**now, "shardings": shardings if shardings is not None else meta.get("shardings")})
    if why is not None:
        return None, meta, why
    try:
        return _deserialize(found[1], meta.get("execution_devices")), meta, ""
    except Exception as exc:  # noqa: BLE001  (JAX's own errors for bytes it cannot load)
        return None, meta, f"JAX could not load it: {type(exc).__name__}: {exc}"


def prefetch() -> None:
    """Starts loading this process's stored executables (a restart's),
    called once ``jax.distributed`` is up: loading releases the GIL, so it
    overlaps the program's own start (its restore, its loaders)."""
    folder = _folder()
    if folder is None:
        return
    try:
        listed = _native.list_executables(folder)
    except StorageError:
        return
    import jax

    rank = jax.process_index()
    # The newest first: a program initializes, then loops, and a restart
    # restores instead of initializing, so what it calls first (its step)
    # was compiled last.
    ours = []
    for key, text in listed:
        meta = json.loads(text)
        if meta.get("kind") == "jit" and meta.get("process") == rank and key not in _prefetched:
            ours.append((-float(meta.get("stored", 0.0)), key))
    mine: dict[str, Future[Any]] = {}
    for _, key in sorted(ours):
        mine[key] = _prefetched[key] = Future()
    if not mine:
        return
    now = _identity()

    def load_all() -> None:
        for i, (key, future) in enumerate(mine.items()):
            if i == 1:
                _first_ran.wait()
            if not future.set_running_or_notify_cancel():
                continue  # its first call came first and loads it itself
            try:
                compiled, meta, why = _load(folder, key, now, None)
            except BaseException as exc:  # noqa: BLE001  (its first call compiles it, saying why)
                compiled, meta, why = None, None, f"loading it failed: {type(exc).__name__}: {exc}"
            future.set_result((compiled, meta, why))

    threading.Thread(target=load_all, name="meshrun-prefetch", daemon=True).start()


class Jitted:
    """A jitted function whose executables travel (see the module)."""

    def __init__(self, fun: Callable[..., Any], name: str | None, travel: bool, jit_kwargs: dict[str, Any]) -> None:
        import jax

        _jax_private.cache_reads_kept()
        for static in _STATIC:
            if static in jit_kwargs:
                raise TypeError(f"meshrun.jit: {static} is not supported; bind static values with functools.partial before jitting")
        self.fun = fun
        self.name = name or f"{getattr(fun, '__module__', '?')}.{getattr(fun, '__qualname__', repr(fun))}"
        self.travel = travel
        # The shardings asked for go beside the key with the arguments', so
        # that another mesh is told as such.
        self._kwargs = {k: repr(v) for k, v in sorted(jit_kwargs.items()) if k not in _PLACED}
        self._placement = {k: _placement(jit_kwargs[k]) for k in _PLACED if k in jit_kwargs}
        self._jit = jax.jit(fun, **jit_kwargs)
        self._compiled: dict[Any, Any] = {}
        #: What the first call of each signature did: ``("loaded", None)``,
        #: or ``("compiled", why none was loaded)``.
        self.outcomes: list[tuple[str, str | None]] = []

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self._jit.lower(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import jax

        checks.raise_if_stale()
        folder = _folder()
        if kwargs or not self.travel or folder is None:
            return self._jit(*args, **kwargs)
        leaves, tree = jax.tree.flatten(args)
        # Every call: a cheap key of the signature (objects, no text).
        seen = (tree, tuple(_cheap(x) for x in leaves))
        compiled = self._compiled.get(seen)
        if compiled is not None:
            return compiled(*args)
        described = [_leaf(x) for x in leaves]
        signature = _digest([_tree_text(tree), [d[0] for d in described]])
        compiled, check = self._first_call(folder, signature, args, described)
        try:
            out = compiled(*args)
        except Exception as exc:
            if check is None:
                raise
            # Loaded, yet JAX cannot run it (it failed before running: the
            # arguments are intact): compiled here instead, and not kept.
            why = f"JAX could not run it: {type(exc).__name__}: {exc}"
            with contextlib.suppress(StorageError):
                _native.remove_executable(folder, self._key(signature))
            self.outcomes.append(("compiled", why))
            _event(self.name, "compiled", 0.0, why)
            compiled, check = self._jit.lower(*args).compile(), None
            out = compiled(*args)
        self._compiled[seen] = compiled
        if check is not None:
            # Only an executable that ran is checked, once its first step
            # has computed (the prefetch's others wait for that too).
            checks.add(check)

            def ran() -> None:
                _first_ran.set()
                checks.start_all()

            first = jax.tree.leaves(out)
            checks.when_computed(first[0] if first else None, ran)
        else:
            # Compiled: no thread waits on its output (one still inside
            # JAX when the interpreter exits aborts the process).
            _first_ran.set()
        return out

    def _first_call(self, folder: str, signature: str, args: Any, described: list[Any]) -> tuple[Any, checks.Check | None]:
        """The executable, and its check when it was loaded."""
        import jax

        rank = jax.process_index()
        key = self._key(signature)
        now = _identity()
        shardings = [[d[1] for d in described], self._placement]
        start = time.time()
        ahead = _prefetched.pop(key, None)
        if ahead is not None and ahead.cancel():
            # Not begun: loaded here and now, beside the others, rather than
            # after those listed before it (a restart's train step waited
            # for its initializers to load, 0.8 s, on 2 cores).
            ahead = None
        if ahead is not None:
            # What the first call waits for counts (the goodput is the
            # main thread's); the load's own span overlapped the program.
            compiled, meta, why = ahead.result()
            if compiled is not None and meta is not None and meta.get("shardings") != shardings:
                compiled, why = None, _differs(meta, {**now, "shardings": shardings})
        else:
            compiled, meta, why = _load(folder, key, now, shardings)
        if compiled is not None and meta is not None:
            took = time.time() - start
            _goodput.compile_span(start, time.time())
            self.outcomes.append(("loaded", None))
            _event(self.name, "loaded", took, None)
            abstract = jax.tree.map(_abstract, args)
            _recorder.loaded(compiled, meta.get("recorded"))
            return compiled, checks.Check(self.name, folder, key, meta["program"], lambda: _program_digest(self._jit.lower(*abstract)), self._stale)
        lowered = self._jit.lower(*args)
        with _jax_private.cache_reads() as hits:
            compiled = lowered.compile()
        self.outcomes.append(("compiled", why))
        _event(self.name, "compiled", time.time() - start, why)
        # Kept before its first step runs (a tenth of a second or two to
        # serialize): any step that ran, a restart can load.
        meta = {**now, "shardings": shardings, "program": _program_digest(lowered), "name": self.name, "kind": "jit", "process": rank, "stored": time.time()}
        meta["execution_devices"] = _jax_private.execution_device_ids(compiled)
        meta["recorded"] = _recorder.described(compiled)
        _store(folder, key, meta, compiled, hits)
        return compiled, None

    def _key(self, signature: str) -> str:
        import jax

        return _digest([_FORMAT, "jit", self.name, self._kwargs, jax.process_index(), signature])

    def _stale(self, why: str) -> None:
        _event(self.name, "stale", 0.0, why)


def _cheap(x: Any) -> tuple[Any, ...]:
    return (getattr(x, "shape", None), getattr(x, "dtype", type(x)), getattr(x, "weak_type", None), getattr(x, "sharding", None))


def _abstract(x: Any) -> Any:
    """``x`` as the check re-traces it: as ``lower`` saw it. An uncommitted
    array (``jnp.arange(4.0)``) lowers without a sharding; giving it its
    default device's would trace another program and find it stale."""
    import jax

    sharding = getattr(x, "sharding", None) if getattr(x, "committed", True) else None
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=getattr(x, "weak_type", False))


def _program_digest(lowered: Any) -> str:
    return hashlib.sha256(lowered.as_text().encode()).hexdigest()


def _store(folder: str, key: str, meta: dict[str, Any], compiled: Any, hits: list[tuple[Any, bytes]]) -> None:
    try:
        exe, in_tree, out_tree = _jax_private.serialize(compiled, hits)
        _native.store_executable(folder, key, json.dumps(meta), pickle.dumps((exe, in_tree, out_tree)))
    except Exception as exc:  # noqa: BLE001  (a backend that cannot serialize; a full disk)
        print(f"meshrun: the executable of {meta['name']} is not kept for a restart: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def jit(fun: Callable[..., Any] | None = None, *, name: str | None = None, travel: bool = True, **jit_kwargs: Any) -> Any:
    """``jax.jit`` whose executables a restarted process loads instead of
    compiling (see the module). ``name``: how events and the key name the
    function (default: its module and qualified name; two functions of the
    same name in one program need names of their own). ``travel=False``: a
    plain ``jax.jit``. Every other keyword is ``jax.jit``'s, but for static
    arguments (bind them with ``functools.partial``). Usable as a
    decorator, with or without arguments."""
    if fun is None:
        return lambda f: Jitted(f, name, travel, jit_kwargs)
    return Jitted(fun, name, travel, jit_kwargs)


def eval_shape(fun: Callable[..., Any], *args: Any, name: str | None = None) -> Any:
    """``jax.eval_shape(fun, *args)``, kept for a restart, which uses an
    earlier attempt's result at once (checked in the background, as a
    loaded executable is). Arguments may be arrays or abstract shapes."""
    import jax

    folder = _folder()
    if folder is None:
        return jax.eval_shape(fun, *args)
    name = name or f"{getattr(fun, '__module__', '?')}.{getattr(fun, '__qualname__', repr(fun))}"
    what = f"eval_shape of {name}"
    leaves, tree = jax.tree.flatten(args)
    key = _digest([_FORMAT, "eval_shape", name, jax.process_index(), _tree_text(tree), [_leaf(x)[0] for x in leaves]])
    now = {**_identity(), "shardings": None}
    start = time.time()
    why = "no result of this function for these arguments yet"
    try:
        found = _native.load_executable(folder, key)
    except StorageError as exc:
        found, why = None, str(exc)
    if found is not None:
        meta = json.loads(found[0])
        why = _differs(meta, now) or ""
        if not why:
            try:
                result = pickle.loads(found[1])
            except Exception as exc:  # noqa: BLE001  (a class it holds is gone: compute it)
                why = f"it does not unpickle: {type(exc).__name__}: {exc}"
            else:
                _goodput.compile_span(start, time.time())
                _event(what, "loaded", time.time() - start, None)
                program = lambda: _shapes_digest(jax.eval_shape(fun, *args))  # noqa: E731
                checks.add(checks.Check(what, folder, key, meta["program"], program, lambda stale: _event(what, "stale", 0.0, stale)))
                return result
    result = jax.eval_shape(fun, *args)
    _event(what, "compiled", time.time() - start, why)
    meta = {**now, "program": _shapes_digest(result), "name": name, "kind": "eval_shape"}
    try:
        _native.store_executable(folder, key, json.dumps(meta), pickle.dumps(_unplaced(result)))
    except Exception as exc:  # noqa: BLE001  (a result that does not pickle; a full disk)
        print(f"meshrun: the shapes of {name} are not kept for a restart: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return result


def _unplaced(tree: Any) -> Any:
    """Abstract shapes without their shardings (which hold devices)."""
    import jax

    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type), tree)


def _shapes_digest(tree: Any) -> str:
    import jax

    leaves, structure = jax.tree.flatten(_unplaced(tree))
    return _digest([_tree_text(structure), [[list(x.shape), str(x.dtype), x.weak_type] for x in leaves]])
