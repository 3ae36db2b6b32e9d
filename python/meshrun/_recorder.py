"""The flight recorder: what this rank compiled and called across processes.

JAX's rule for a program on many processes is that every process runs the
same computations, in the same order, with the same global shapes; a rank
that breaks it hangs in a collective the others never enter, or computes
the wrong thing. Nothing in JAX checks it. Here every program this process
compiles (or loads, see :mod:`meshrun._executables`) whose devices are on
every process of the run and whose optimized form communicates (holds a
collective) is described once to the controller (its fingerprint, name,
arguments' global shapes and shardings, size, collectives, and the Python
line that compiled it), and each call of such a program is numbered and
sent. The controller compares the ranks' n-th calls as they come (see
meshrun-machine's ``programs``): a rank that calls another program, or
the same with other shapes, or that calls one after another rank finished
its program, is named at once, and a hang's summary says which call each
rank is in.

Programs on one process's devices, or that do not communicate (a rank 0's
own evaluation or logging), are not counted: a rank may run those alone.

JAX dispatches a jitted function's later calls from C++ without Python;
for the programs counted here, that fast path is left off, so their calls
go through JAX's Python dispatch (its effect on the demo GPT's step is in
docs/benchmarks.md, "The flight recorder").
The hooks are in :mod:`meshrun._jax_private`. ``MESHRUN_RECORDER=0``
turns the recorder off.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import re
import sys
import threading
import zlib
from typing import Any

from meshrun import _connection, _jax_private
from meshrun._native import ENV

__all__ = ["described", "install", "loaded", "replicas"]

# Counted programs by id of their executable: (executable, fingerprint, name).
_counted: dict[int, tuple[Any, str, str]] = {}
# What was said of each counted program, by id of its executable.
_said: dict[int, dict[str, Any]] = {}
# The fingerprints of the global arrays' pieces described so far.
_pieces: set[str] = set()
_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int32": "s32", "int64": "s64", "uint8": "u8", "bool": "pred"}
_numbers = itertools.count(1)
_lock = threading.Lock()
_broken: list[str] = []
_installed: list[bool] = []

_COLLECTIVE = re.compile(
    r"= (\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|collective-broadcast)(?:-start)?\("
)
_TENSOR = re.compile(r"tensor<((?:[0-9?]+x)*)([a-z]+[0-9]*)>")
_SHARDING = re.compile(r'mhlo\.sharding = "([^"]*)"|sdy\.sharding = (#sdy\.sharding<[^>]*>)')
# Frames that are not the user's: JAX's, jaxlib's, this package's, and the
# interpreter's frozen modules (runpy).
_OWN_FILES = (os.sep + "jax" + os.sep, os.sep + "jaxlib" + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep, "<frozen ")


def install() -> None:
    """Turns the recorder on in this worker (before the user's code)."""
    client = _connection.client()
    if os.environ.get(ENV["recorder"], "1") == "0" or client is None:
        return
    if _jax_private.watch_programs(_compiled, _called, _is_counted):
        _watch_pieces()
        _installed.append(True)
        client.call(0, "", "")


def replicas(step: int, state: Any) -> None:
    """Checks that the replicated leaves of ``state`` are the same on every
    process: each process's copy of each leaf whose sharding replicates it
    over every process is checksummed (CRC-32 of its bytes), and the list
    goes to the controller as a call across processes, which compares the
    ranks' lists (a data-parallel program whose replicas were initialized
    from a per-process seed trains on, each process with its own numbers).
    ``meshrun.report`` calls it with the state at its first report and at
    each checkpoint; it reads each replicated leaf back once. Only on the
    main thread, as every numbered call: a check from another thread has
    no place in the order of the main thread's calls that the ranks share."""
    client = _connection.client()
    if _broken or client is None or not _installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        import jax
        import numpy as np

        values = []
        for path, leaf in jax.tree_util.tree_leaves_with_path(state):
            sharding = getattr(leaf, "sharding", None)
            if sharding is None or not getattr(leaf, "is_fully_replicated", False):
                continue
            processes = {d.process_index for d in sharding.device_set}
            if len(processes) < 2 or len(processes) != jax.process_count():
                continue
            data = np.ascontiguousarray(np.asarray(leaf.addressable_shards[0].data))
            values.append(f"{jax.tree_util.keystr(path, simple=True, separator='/')} {zlib.crc32(data.reshape(-1).view(np.uint8).data) & 0xFFFFFFFF:08x}")
        if not values:
            return
        name = f"the replicated values of the state at step {step}"
        fingerprint = hashlib.sha256("\n".join([name, *values]).encode()).hexdigest()
        site = _site()
        client.program(fingerprint, name, "", 0, [], site, values)
        n = next(_numbers)
        client.call(n, fingerprint, site)
    except Exception as exc:  # noqa: BLE001  (the recorder must never break the program)
        _give_up(exc)


def described(compiled: Any) -> dict[str, Any] | None:
    """What was said of a compiled function's program (``jax.stages.Compiled``),
    for :mod:`meshrun._executables` to keep with it; None when it is not
    counted."""
    try:
        return _said.get(id(compiled.runtime_executable()))
    except Exception:  # noqa: BLE001  (a JAX of another shape)
        return None


def loaded(compiled: Any, said: dict[str, Any] | None) -> None:
    """Counts a program that :mod:`meshrun._executables` loaded instead of
    compiling (JAX's compile hook never sees it), as its first compile
    described it (``said``: None, a program not counted)."""
    if _broken or not said:
        return
    try:
        _count(compiled.runtime_executable(), **said)
    except Exception as exc:  # noqa: BLE001  (the recorder must never break the program)
        _give_up(exc)


def _compiled(executable: Any, stablehlo: Any, devices: Any) -> None:
    """JAX compiled (or read from its cache) ``executable``: counted when
    it spans every process and communicates."""
    if _broken:
        return
    try:
        import jax

        processes = {d.process_index for d in devices.flat}
        if len(processes) < 2 or len(processes) != jax.process_count():
            return
        optimized = "\n".join(m.to_string() for m in executable.hlo_modules())
        collectives = [f"{kind} {shape}" for shape, kind in _COLLECTIVE.findall(optimized)]
        if not collectives:
            return
        text = stablehlo()
        fingerprint = hashlib.sha256(text.encode()).hexdigest()
        _count(executable, fingerprint, _name_of(text), _args_of(text), text.count("\n"), collectives[:64], _site())
    except Exception as exc:  # noqa: BLE001  (the recorder must never break the program)
        _give_up(exc)


def _count(executable: Any, fingerprint: str, name: str, args: str, size: int, collectives: list[str], site: str) -> None:
    with _lock:
        _counted[id(executable)] = (executable, fingerprint, name)
        _said[id(executable)] = {"fingerprint": fingerprint, "name": name, "args": args, "size": size, "collectives": collectives, "site": site}
    client = _connection.client()
    if client is not None:
        client.program(fingerprint, name, args, size, collectives, site)


def _watch_pieces() -> None:
    """Counts ``jax.make_array_from_process_local_data`` as a call across
    processes, described by the local and global shapes: a process whose
    piece has another shape than the others' makes a global array JAX
    assembles wrongly without a word (it assumes every process's rows are
    its own), and is named here."""
    import jax

    original = jax.make_array_from_process_local_data
    if getattr(original, "_meshrun", False):
        return

    @functools.wraps(original)
    def make_array_from_process_local_data(sharding: Any, local_data: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(sharding, local_data, *args, **kwargs)
        if not _broken:
            try:
                _piece(sharding, local_data, out)
            except Exception as exc:  # noqa: BLE001  (the recorder must never break the program)
                _give_up(exc)
        return out

    make_array_from_process_local_data._meshrun = True  # type: ignore[attr-defined]
    jax.make_array_from_process_local_data = make_array_from_process_local_data


def _piece(sharding: Any, local_data: Any, out: Any) -> None:
    import jax

    processes = {d.process_index for d in sharding.device_set}
    if len(processes) < 2 or len(processes) != jax.process_count() or threading.current_thread() is not threading.main_thread():
        return
    dtype = _DTYPES.get(str(out.dtype), str(out.dtype))
    local = ",".join(str(d) for d in getattr(local_data, "shape", ()))
    whole = ",".join(str(d) for d in out.shape)
    args = f"{dtype}[{local}] on {len(sharding.addressable_devices)} devices, of {dtype}[{whole}]"
    fingerprint = hashlib.sha256(f"pieces|{args}|{sharding!r}".encode()).hexdigest()
    name = "make_array_from_process_local_data"
    site = _site()
    client = _connection.client()
    with _lock:
        new = fingerprint not in _pieces
        _pieces.add(fingerprint)
    if new and client is not None:
        client.program(fingerprint, name, args, 0, [], site)
    n = next(_numbers)
    if client is not None:
        client.call(n, fingerprint, site)


def _is_counted(executable: Any) -> bool:
    return executable is not None and id(executable) in _counted


def _called(executable: Any) -> None:
    """Numbers a call of a counted program made on the main thread: calls
    from other threads (a checkpointer's background work) have no order
    relative to the main thread's that the ranks could share."""
    found = _counted.get(id(executable))
    if found is None or threading.current_thread() is not threading.main_thread():
        return
    n = next(_numbers)
    site = _site()
    client = _connection.client()
    if client is not None:
        client.call(n, found[1], site)


def _site() -> str:
    """The innermost line of the user's code on this thread's stack."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(part in name for part in _OWN_FILES):
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _name_of(text: str) -> str:
    found = re.search(r"module @(\S+)", text)
    return found.group(1) if found else "a program"


def _args_of(text: str) -> str:
    """The main function's arguments as ``f32[16,4]{sharding}``, in order."""
    found = re.search(r"func\.func public @main\((.*?)\) ->", text)
    if found is None:
        found = re.search(r"func\.func public @main\((.*?)\)\s*\{", text)
    if found is None:
        return ""
    out = []
    for arg in re.split(r", (?=%arg)", found.group(1)):
        tensor = _TENSOR.search(arg)
        if tensor is None:
            continue
        dims = tensor.group(1).rstrip("x").replace("x", ",")
        words = f"{tensor.group(2)}[{dims}]"
        sharding = _SHARDING.search(arg)
        if sharding is not None:
            words += sharding.group(1) or sharding.group(2) or ""
        out.append(words)
    return ", ".join(out)


def _give_up(exc: BaseException) -> None:
    """Turns the recorder off in this process, saying why once."""
    if not _broken:
        _broken.append(f"{type(exc).__name__}: {exc}")
        with _lock:
            _counted.clear()
            _said.clear()
        sys.stderr.write(f"meshrun: warning: the flight recorder is off in this process ({_broken[0]}); mistakes across processes are not named\n")
        sys.stderr.flush()
