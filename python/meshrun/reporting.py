"""``meshrun.report``: record metrics without a barrier and without
blocking the step.

A metric is often a ``jax.Array`` still being computed; reading it
(``float(x)``) would wait for the device and stall the training loop. So a
record waits in a queue until its values are ready, and ready records are
sent on later calls, oldest first. Values are read on the caller's thread
only: reading a JAX array from a helper thread while the main thread
dispatches multi-process CPU collectives was seen to deadlock. The native
client then sends the record from a Rust thread.
"""

from __future__ import annotations

import numbers
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

from meshrun import _cluster, _connection, _device_memory, _goodput, _profile, _recorder, _values, checkpoint as ckpt
from meshrun.context import get_context
from meshrun.errors import ConfigError, MeshrunError

__all__ = ["report"]


class _Record(NamedTuple):
    step: int | None
    metrics: dict[str, Any]
    checkpoint: bool  # it came with a state to checkpoint
    saving: bool  # a save of this step began with it
    timing: dict[str, float] | None  # the worker's goodput figures, when they go with it
    total_steps: int | None


_queue: deque[_Record] = deque()
_lock = threading.Lock()
_warned = False
# Records dropped unread: a value raised when read (a JAX array whose
# computation failed, as every collective does once a peer is gone), or
# was never computed before a failure ended the program. How many, the
# first few steps and the first error, said in one line at the end.
_unread = 0
_unread_steps: list[int | None] = []
_unread_error = ""
# The step of the next report that names none (Ray Train's programs rarely
# do): one more than the last step reported, starting after the step this
# attempt resumed from, so that every rank numbers its reports alike.
_next_step: int | None = None


def _step_of(step: int | None, metrics: Mapping[str, Any]) -> int:
    global _next_step
    named = metrics.get("step")
    if step is None and isinstance(named, numbers.Integral) and not isinstance(named, bool):
        step = int(named)
    if step is None:
        if _next_step is None:
            _next_step = _first_step()
        step = _next_step
    _next_step = step + 1
    return step


def _first_step() -> int:
    try:
        # Not get_checkpoint(): a report must not wait for a commit.
        resumed = ckpt._chosen_or_newer()
    except MeshrunError:  # no run's storage to look in
        return 0
    return 0 if resumed is None or resumed.step is None else resumed.step + 1


def _ready(value: Any) -> bool:
    if isinstance(value, Mapping):
        return all(_ready(v) for v in value.values())
    is_ready = getattr(value, "is_ready", None)
    try:
        return is_ready is None or bool(is_ready())
    except Exception:  # noqa: BLE001 - reading it says what went wrong
        return True


def _send(record: _Record) -> None:
    client = _connection.client()
    if client is None:
        return
    try:
        metrics = _values.plain(record.metrics)
    except (TypeError, ValueError, RecursionError) as exc:
        warnings.warn(f"meshrun.report: record of step {record.step} dropped: {exc}", RuntimeWarning, stacklevel=3)
        return
    except Exception as exc:  # noqa: BLE001
        # A value whose computation failed: the program meets the same
        # error where it reads its own values, and a traceback from here
        # would only bury that one. Counted, and said once at the end.
        text = str(exc).strip()
        _count_unread(record.step, f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__)
        return
    client.report(record.step, metrics, record.checkpoint, record.timing, record.saving, record.total_steps)


def _send_ready(wait: bool) -> None:
    """Sends queued records in order; stops at the first one not yet
    computed unless ``wait``, which reads (and so waits for) every value."""
    with _lock:
        while _queue and (wait or _ready(_queue[0].metrics)):
            _send(_queue.popleft())


def _checkpoint_due(step: int) -> bool:
    """Whether a state passed at ``step`` is saved: when the controller
    asked for one (preemption), or at the run's checkpoint interval, or
    always when no interval is set, unless a memory interval is: then
    memory keeps the state, and storage only a preemption's."""
    client = _connection.client()
    if client is not None and client.checkpoint_requested():
        return True
    ctx = get_context()
    if ctx.checkpoint_every is None:
        return ctx.memory_every is None
    return step % ctx.checkpoint_every == 0


# A run asked to checkpoint whose program reports this many steps due for a
# save without ever passing its state is told so, once: one such report may
# come before the state exists (an evaluation at step 0); two mean the
# program does not pass it, and the flag does nothing.
_DUE_WITHOUT_STATE = 2
# The checkpoint flags given (None: not read yet); whether the watch goes
# on (until a state is passed or the warning is said); due steps so far.
_asked: list[tuple[str, int]] | None = None
_watching = True
_due_without_state = 0


def _note_state(step: int, passed: bool) -> None:
    """Rank 0 warns once when the run's checkpoint flags do nothing because
    the program never passes its state to ``report``."""
    global _asked, _watching, _due_without_state
    if not _watching:
        return
    if passed:
        _watching = False
        return
    if _asked is None:
        ctx = get_context()
        given = [("--checkpoint-every", ctx.checkpoint_every), ("--memory-checkpoint-every", ctx.memory_every)]
        _asked = [(flag, every) for flag, every in given if every] if ctx.rank == 0 and _connection.client() is not None else []
        _watching = bool(_asked)
    if not any(step % every == 0 for _, every in _asked):
        return
    _due_without_state += 1
    if _due_without_state < _DUE_WITHOUT_STATE:
        return
    _watching = False
    flags = " and ".join(f"{flag} {every}" for flag, every in _asked)
    one = len(_asked) == 1
    sys.stderr.write(
        f"meshrun: warning: {flags} {'was' if one else 'were'} given, but the program has passed no state to "
        f"meshrun.report(checkpoint=...) by step {step}: {'that flag saves' if one else 'those flags save'} only such a "
        f"state, so {'it does' if one else 'they do'} nothing here. Pass the state with each report (it is kept at the "
        "steps due), or leave the flag out\n"
    )
    sys.stderr.flush()


def _memory_due(step: int) -> bool:
    """Whether a state passed at ``step`` goes to the host's memory tier
    (when no durable save is due at that step)."""
    every = get_context().memory_every
    return every is not None and step % every == 0 and _connection.client() is not None


# Whether the replicated values of a state passed were checked (see
# meshrun._recorder): the first state passed is, then each checkpoint's.
_replicas_checked = False


def report(
    metrics: Mapping[str, Any],
    *,
    step: int | None = None,
    checkpoint: Any = None,
    extra: Mapping[str, Any] | None = None,
    total_steps: int | None = None,
) -> None:
    """Records ``metrics`` (rank 0's go to ``metrics.jsonl``). Returns without
    waiting for the device; ``step`` defaults to ``metrics["step"]``, else
    to one more than the step reported before (the first report of an
    attempt: one more than the step it resumed from, or 0).

    With ``checkpoint`` (a pytree), also saves it as that step, with the
    metrics and ``extra`` (for example the data loader's state) in its
    manifest: see :func:`meshrun.save`. Every rank passes its state. With
    ``checkpoint=Checkpoint.from_directory(folder)`` (Ray Train's way), the
    folder is copied into the run's storage before ``report`` returns, from
    whichever ranks pass one; the step commits once every rank has
    reported it. With a checkpoint interval
    (``--checkpoint-every N`` / ``CheckpointConfig(every_n_steps=N)``) only
    steps divisible by N are saved, so the state can be passed at every
    step; then a preempted run (SIGTERM to ``meshrun``) saves at its next
    report and stops. With a memory interval alone
    (``--memory-checkpoint-every N``) the state goes to the hosts' memory
    every N steps, and to storage only when preempted. A run given either
    interval whose program passes no state warns once, from rank 0.
    ``total_steps``: how many steps the program runs, for the progress
    line's ETA."""
    global _warned, _replicas_checked
    # When this rank got to the step: the straggler measure (see
    # meshrun_record's lag), taken before anything here can wait.
    arrived = time.time_ns()
    if not isinstance(metrics, Mapping):
        raise TypeError(f"meshrun.report expects a dict of metrics, got {type(metrics).__name__}")
    if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 0):
        raise TypeError(f"meshrun.report(total_steps=...) must be a non-negative integer, got {total_steps!r}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise TypeError(f"meshrun.report(step=...) must be a non-negative integer, got {step!r}")
    folder = None
    if isinstance(checkpoint, ckpt.Checkpoint):
        if checkpoint.step is not None:
            raise ConfigError(
                f"meshrun.report(checkpoint=...) got committed checkpoint step {checkpoint.step} of the run ({checkpoint.path}); "
                "pass the state to save, or a new folder with meshrun.Checkpoint.from_directory(path)"
            )
        folder = checkpoint.path
    elif type(checkpoint).__name__ == "Checkpoint" and hasattr(checkpoint, "as_directory"):
        raise ConfigError(
            f"meshrun.report(checkpoint=...) got a {type(checkpoint).__module__}.Checkpoint; "
            "use meshrun.Checkpoint.from_directory(path) for the folder, or pass the state (a pytree) itself"
        )
    at = _step_of(step, metrics)
    client = _connection.client()
    if client is not None:
        # Earlier steps whose values are computed go first: a save below may
        # wait (for the last one's copy, or a loaded executable's check).
        _send_ready(wait=False)
        client.step_reached(at, arrived)
        _profile.at_report(client, at)
        _device_memory.at_report(client)
    _note_state(at, checkpoint is not None)
    # A meshrun.save() of this very step, then its report: the step's
    # commit waits for this rank's part instead of taking the report as
    # "nothing saved here" while the part is still being written.
    saving = checkpoint is None and ckpt._last_saved == at
    preempting = False
    if checkpoint is not None and folder is None and (not _replicas_checked or _checkpoint_due(at)):
        _replicas_checked = True
        _recorder.replicas(at, checkpoint)
    if checkpoint is not None:
        if _checkpoint_due(at):
            client = _connection.client()
            if client is not None and client.checkpoint_requested():
                preempting = True
                client.preempt_save(at)
            plain = _values.plain(dict(metrics))
            if folder is not None:
                saving = ckpt.save_directory(at, folder, metrics=plain, extra=extra)
            else:
                ckpt.save(at, checkpoint, metrics=plain, extra=extra)
                saving = True
        if folder is None and _memory_due(at):
            ckpt.save_memory(at, checkpoint, metrics=_values.plain(dict(metrics)), extra=extra)
    if _connection.client() is None:
        if not _warned:
            _warned = True
            warnings.warn("meshrun.report: not running under meshrun; metrics are not recorded", RuntimeWarning, stacklevel=2)
        return
    # A cheap flag once it has decided; the first report is where a user
    # who forgot jax.distributed.initialize() can first be told.
    _cluster.warn_if_not_joined()
    record = _Record(at, dict(metrics), checkpoint is not None, saving, _goodput.due(saving), total_steps)
    with _lock:
        _queue.append(record)
    # A folder handed over commits once every rank's report of its step is
    # in: that report goes now, so that no wait for the commit (wait_committed,
    # a restore of the newest) waits on a record still queued.
    _send_ready(wait=folder is not None)
    if preempting:
        _wait_for_the_stop(at)


# After a preemption save a worker waits for the stop (the controller
# commits the step and ends the group at once) or for word that the step
# cannot commit; a controller that says neither for this long is stuck,
# and the program goes on.
_PREEMPT_WAIT_S = 120.0


def _wait_for_the_stop(step: int) -> None:
    """No rank trains past the checkpoint that ends a preempted run."""
    _send_ready(wait=True)
    ckpt.wait()
    client = _connection.client()
    if client is not None:
        client.wait_resumed(step, _PREEMPT_WAIT_S)


def _drain(wait: bool) -> None:
    """Sends what is queued: everything when ``wait`` (the program ended
    normally), else only what is already computed (after a failure, a value
    may never be); then says how many records could not be read."""
    _send_ready(wait)
    with _lock:
        for record in _queue:
            _count_unread(record.step, "not computed when the program ended")
        _queue.clear()
    _say_unread()
    client = _connection.client()
    if client is not None:
        _profile.finish(client)
        client.flush()


def _count_unread(step: int | None, why: str) -> None:
    global _unread, _unread_error
    _unread += 1
    if len(_unread_steps) < 5:
        _unread_steps.append(step)
    _unread_error = _unread_error or why


def _say_unread() -> None:
    """One line for the records dropped unread: the first steps, and the
    first error (else why)."""
    global _unread, _unread_error
    if not _unread:
        return
    steps = ", ".join("-" if s is None else str(s) for s in _unread_steps) + (", ..." if _unread > len(_unread_steps) else "")
    what = "1 metric record could not be read and was dropped (step" if _unread == 1 else f"{_unread} metric records could not be read and were dropped (steps"
    print(f"meshrun: {what} {steps}): {_unread_error}", file=sys.stderr, flush=True)
    _unread, _unread_error = 0, ""
    _unread_steps.clear()
