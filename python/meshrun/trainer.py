"""Function mode: ``Trainer(train_fn, ...).fit()``, named as Ray Train names
it. The function and its config travel to the workers through the run
directory (cloudpickle); the controller runs in this process."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshrun import _from_ray, _native, ray_data
from meshrun._native import DEFAULTS
from meshrun.checkpoint import Checkpoint
from meshrun.errors import ConfigError, MeshrunError, RunFailedError, TrainingFailedError

__all__ = ["CheckpointConfig", "FailureConfig", "Result", "RunConfig", "ScalingConfig", "Trainer"]


@dataclass
class ScalingConfig:
    """How many workers, and what each gets.

    ``devices_per_worker``: CPU devices per worker (cpu platform).
    ``use_gpu``/``gpus_per_worker``: whole GPUs per worker, never shared.
    ``num_hosts``: hosts (one agent each); must divide ``num_workers``.
    Local backend: each agent on its own loopback address. ``backend="ray"``:
    each host is a placement-group bundle with its workers' CPUs and GPUs
    on the Ray cluster at ``ray_address`` (``"auto"`` or the head's
    ``HOST:PORT``), placed with ``ray_strategy``; the controller listens
    on ``control_host`` (default: every interface) at ``control_port``
    (default: any free port). ``listen="ADDR:PORT"``: hosts 1.. join by
    themselves (``meshrun join ADDR:PORT`` on each, under Slurm, SSH or
    Kubernetes) within ``join_timeout_s`` (default 300); this process is
    host 0.
    """

    #: A count, or ``(MIN, MAX)``: an elastic run that grows and shrinks by
    #: whole hosts (each worker its own host unless ``num_hosts`` says how
    #: many hosts MAX workers fill). See docs/elastic.md.
    num_workers: int | tuple[int, int] = 1
    devices_per_worker: int | None = None
    use_gpu: bool = False
    gpus_per_worker: int | None = None
    num_hosts: int = 1
    platform: str | None = None
    backend: str = "local"
    ray_address: str | None = None
    ray_strategy: str = str(DEFAULTS["ray_strategy"])
    control_host: str | None = None
    control_port: int | None = None
    listen: str | None = None
    join_timeout_s: float | None = None
    #: Elastic runs: how long a restart waits for a lost host before it runs
    #: on the hosts present (default 60 s).
    rejoin_timeout_s: float | None = None
    #: Elastic runs: any host count from MIN to MAX, not only those that
    #: divide MAX.
    any_host_count: bool = False
    #: Ray's name: ``{"CPU": c, "GPU": g}`` per worker. GPUs are whole and
    #: never shared (``gpus_per_worker``); CPUs are what each worker's Ray
    #: bundle asks for (default 1), and on this machine they must fit in
    #: its cores.
    resources_per_worker: dict[str, float] | None = None
    #: CPUs per worker (set from ``resources_per_worker``).
    cpus_per_worker: float | None = None
    #: Memory each worker may use: bytes, or a size such as ``"2GiB"``. Its
    #: host memory (a cgroup limit) on CPU, its GPU's memory on CUDA; a
    #: worker past it is reported as out of memory (docs/fitting.md).
    memory_per_worker: int | str | None = None


@dataclass
class CheckpointConfig:
    """When to save and which committed checkpoints to keep.

    ``every_n_steps``: a state passed to ``meshrun.report(checkpoint=...)``
    is saved only at steps divisible by it (and when the run is preempted),
    so a program can pass its state at every step. Retention, applied by
    the controller after each commit: ``num_to_keep`` most recent (or best
    by ``score_attribute``, a metric saved with the checkpoint,
    ``score_order`` "max" or "min"), plus every step divisible by
    ``keep_every_n_steps``. The newest is always kept.

    ``on_save_error``: when a rank's shards cannot be written (the storage
    is down or full), ``"continue"`` trains on without that checkpoint (it
    is not committed, the run's events say why, the next save tries again);
    ``"fail"`` raises the error from the rank's next save, which fails the
    attempt.

    ``memory_every_n_steps``: also keep the state in host memory every N
    steps, with a replica on a buddy host; a restart resumes from the
    newest step held in memory when it is newer than the newest durable
    checkpoint (same process layout only). Given without
    ``every_n_steps``, storage gets only a preemption's checkpoint."""

    num_to_keep: int | None = None
    keep_every_n_steps: int | None = None
    score_attribute: str | None = None
    score_order: str = str(DEFAULTS["score_order"])
    every_n_steps: int | None = None
    on_save_error: str = str(DEFAULTS["on_save_error"])
    memory_every_n_steps: int | None = None


@dataclass
class FailureConfig:
    """What a failed attempt leads to.

    ``max_failures``: failed attempts that are followed by a restart from
    the newest committed checkpoint (0: the first failure ends the run).
    ``hang_timeout_s``: an attempt in which some rank has not called
    ``meshrun.report`` for this many seconds (start-up and compilation
    included) has hung: every rank's Python stacks are written to
    ``stacks/attempt-K/`` in the run directory and the attempt fails.
    ``start_timeout_s``: how long an attempt may wait for cluster
    resources before its first step (a Ray placement group, or the
    workers' Ray Data tasks that the cluster cannot run yet; None: 600 s);
    what waits shows on the progress line, and past the limit the attempt
    fails naming it.
    ``warm_spares``: keep one interpreter per worker with JAX (and
    ``spare_imports``, default jax, jax.numpy, flax, optax where
    installed) already imported, to take over a restarted attempt (None:
    when ``max_failures`` allows restarts).
    """

    max_failures: int = int(DEFAULTS["max_failures"])
    hang_timeout_s: float | None = None
    start_timeout_s: float | None = None
    warm_spares: bool | None = None
    spare_imports: list[str] | None = None


@dataclass
class RunConfig:
    """Where the run is kept, what it is called, when it checkpoints and
    how it recovers."""

    name: str | None = None
    #: A folder, or a URL such as ``s3://bucket/prefix``; ``None``, Ray
    #: Train's default, is meshrun's default folder.
    storage_path: str | None = str(DEFAULTS["storage_path"])
    tee: str = str(DEFAULTS["tee"])
    env: dict[str, str] = field(default_factory=dict)
    checkpoint_config: CheckpointConfig | None = None
    failure_config: FailureConfig | None = None
    #: The live progress line while ``fit()`` runs (plain lines without a terminal).
    progress: bool = True
    #: Rank 0's metrics as TensorBoard event files in ``<run>/tensorboard``.
    tensorboard: bool = False
    #: Resume run ``name`` from its checkpoint of this step instead of the
    #: newest that verifies; the newer ones are set aside (``--resume-from``).
    #: ``"none"``: start from the beginning, every checkpoint set aside.
    resume_from: int | str | None = None
    #: Ray's name: the ``env_vars`` of a Ray ``runtime_env`` are set in
    #: every worker (``env`` wins where both name a variable).
    worker_runtime_env: dict[str, Any] | None = None
    #: The metric shown as the run's loss in the progress line, ``meshrun
    #: ls``/``status`` and the report (``--loss-metric``; default ``loss``,
    #: else the first metric whose name ends in ``loss``, e.g. ``train_loss``).
    loss_metric: str | None = None
    #: A JSON-lines file the program writes its metrics to (one object a
    #: step, with its ``step``); rank 0 follows it and reports each line as
    #: a step, for programs that never call ``meshrun.report``
    #: (``--metrics-file``).
    metrics_file: str | None = None
    #: A rank that reaches its steps this share of a step later than the
    #: median rank, for ``straggler_steps`` steps in a row, is named a
    #: straggler (``--straggler-threshold``, ``--straggler-steps``).
    straggler_threshold: float = 0.2
    straggler_steps: int = 20
    #: One ``jax.profiler`` capture of every rank when a straggler is named
    #: (``--profile-stragglers``).
    profile_stragglers: bool = False
    #: ``(A, B)``: trace every rank from its report of step A to that of
    #: step B (``--profile-steps A:B``).
    profile_steps: tuple[int, int] | None = None


@dataclass
class Result:
    """How a run ended: rank 0's last reported metrics, the run directory,
    the error when it failed (``None`` on success), and its committed
    checkpoints: the newest (``checkpoint``) and every one kept, with the
    metrics saved with it (``best_checkpoints``, oldest first), as in Ray
    Train."""

    metrics: dict[str, Any] | None
    path: str
    error: RunFailedError | None
    #: As ``run.json`` and ``meshrun ls`` say: ``succeeded``, ``preempted``
    #: (saved at a checkpoint on SIGTERM or ``meshrun stop``) or ``stopped``
    #: (``meshrun stop --now``), ``error`` then saying how; a ``failed`` run
    #: raises ``TrainingFailedError``, with this result as its ``result``.
    status: str
    failure: dict[str, Any] | None = None
    attempts: int = 1
    checkpoint: Checkpoint | None = None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = field(default_factory=list)

    @property
    def metrics_dataframe(self) -> Any:
        """Rank 0's reports as a pandas ``DataFrame`` (one row a report:
        its metrics, ``step``, ``attempt`` and ``time``); needs pandas."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ConfigError("Result.metrics_dataframe needs pandas: pip install pandas") from exc
        records, _ = _native.read_metrics(self.path, 0)
        return pd.DataFrame([{**r["metrics"], "step": r["step"], "attempt": r["attempt"], "time": r["time"]} for r in records])


def _checkpoints(root: str) -> list[tuple[Checkpoint, dict[str, Any]]]:
    """The committed checkpoints under ``root``, oldest first, with their
    metrics; none when the storage cannot be read (the run's result is
    still given)."""
    try:
        found = [Checkpoint(path, step) for path, step in _native.committed_checkpoints(root)]
        return [(c, c.metrics) for c in found]
    except MeshrunError:
        return []


def _ours(obj: Any, cls: type, args: Callable[[Any], dict[str, Any]]) -> Any:
    """``obj``, or meshrun's ``cls`` made from it when it is Ray Train's own
    (said once on stderr)."""
    if obj is None or not _from_ray.is_ray(obj):
        return obj
    ours = cls(**args(obj))
    _from_ray.note(f"ray.train.{cls.__name__}", ours)
    return ours


def _resolved(s: ScalingConfig) -> ScalingConfig:
    """``s`` with ``resources_per_worker`` turned into meshrun's fields;
    CPUs asked for on this machine must fit in its cores."""
    cpus, gpus = _from_ray.resources(s)
    if cpus is None and gpus is None:
        return s
    if cpus is not None and s.backend == "local":
        workers = s.num_workers[1] if isinstance(s.num_workers, (tuple, list)) else s.num_workers
        per_host = -(-workers // max(s.num_hosts, 1))
        have = os.cpu_count() or 1
        if cpus * per_host > have:
            raise ConfigError(
                f"ScalingConfig.resources_per_worker asks for {cpus:g} CPU(s) for each of {per_host} worker(s) on this machine, "
                f"which has {have}; lower it, or run on a Ray cluster (backend='ray')"
            )
    return dataclasses.replace(
        s,
        cpus_per_worker=cpus if cpus is not None else s.cpus_per_worker,
        gpus_per_worker=gpus if gpus else s.gpus_per_worker,
        use_gpu=s.use_gpu or bool(gpus),
    )


def _argument(fn: Callable[..., Any], config: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the workers call ``fn`` with: ``config``, or ``None`` for no
    argument. Without a config, a function that takes an argument gets
    ``{}``, as Ray Train gives it. One that cannot be called so is refused
    here, before any worker starts, rather than failing the same way on
    every worker."""
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        # Some callables written in C do not describe their parameters:
        # they are called as given.
        return config

    def takes(*args: Any) -> bool:
        try:
            signature.bind(*args)
        except TypeError:
            return False
        return True

    given = {} if config is None else config
    if takes(given):
        return given
    name = getattr(fn, "__name__", type(fn).__name__)
    if not takes():
        raise ConfigError(
            f"train_loop_per_worker must take one positional argument (train_loop_config) or none, got {name}{signature}; "
            "give its other parameters defaults"
        )
    if config is not None:
        raise ConfigError(
            f"train_loop_per_worker takes no argument, got {name}{signature}, but train_loop_config was given; "
            f"add a parameter for it (def {name}(config): ...) or leave train_loop_config out"
        )
    return None


def _dumps_keeping_file_names(obj: Any) -> bytes:
    """``cloudpickle.dumps``, except that functions pickled by value keep
    the name of the file they were written in.

    cloudpickle renames every such function's file to ``<dynamic-code>`` (so
    that a notebook cell pickles the same wherever it runs), and a failing
    worker's traceback then named no file at all. The line numbers travel
    anyway; with the name, the worker's traceback shows the user's file,
    line and source. Should cloudpickle's internals change shape, this
    falls back to its plain output."""
    import io
    import types
    from collections import ChainMap

    import cloudpickle

    reduce_code = getattr(cloudpickle.cloudpickle, "_code_reduce", None)
    table = getattr(cloudpickle.Pickler, "dispatch_table", None)
    if reduce_code is None or table is None:
        return cloudpickle.dumps(obj)

    def code_with_its_file(code: types.CodeType) -> Any:
        rebuild, args = reduce_code(code)
        return rebuild, tuple(code.co_filename if isinstance(a, str) and a == "<dynamic-code>" else a for a in args)

    dispatch = ChainMap({types.CodeType: code_with_its_file}, table)

    class Pickler(cloudpickle.Pickler):
        dispatch_table = dispatch

    out = io.BytesIO()
    Pickler(out, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
    return out.getvalue()


class Trainer:
    """Runs ``train_fn(config)`` on every worker of a run: ``config`` is
    ``train_loop_config``, ``{}`` when none is given (as in Ray Train); a
    function that takes no argument is called with none.

    Inside the function, ``jax.distributed`` is already initialized,
    :func:`meshrun.get_context` gives the ranks and :func:`meshrun.report`
    records metrics. ``datasets``: Ray Datasets by name, which each worker
    reads its part of with :func:`meshrun.get_dataset_shard`.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
    ) -> None:
        if not callable(train_loop_per_worker):
            raise ConfigError(f"train_loop_per_worker must be callable, got {type(train_loop_per_worker).__name__}")
        self.train_fn = train_loop_per_worker
        self.config = train_loop_config
        self._argument = _argument(train_loop_per_worker, train_loop_config)
        # Ray Train's own config objects are taken for what they say.
        self.scaling = _resolved(_ours(scaling_config, ScalingConfig, _from_ray.scaling_args) or ScalingConfig())
        self.run = _ours(run_config, RunConfig, _from_ray.run_args) or RunConfig()
        self.datasets = datasets

    def _payload(self) -> bytes:
        try:
            return _dumps_keeping_file_names((self.train_fn, self._argument))
        except Exception as exc:
            raise ConfigError(
                f"train_loop_per_worker or train_loop_config cannot be pickled ({type(exc).__name__}: {exc}); "
                "workers receive them through cloudpickle, so they must not hold locks, open files, sockets or devices"
            ) from exc

    def fit(self) -> Result:
        """Runs to the end and returns the result; Ctrl-C stops every
        worker. A run that failed (its restarts used up) raises
        :class:`meshrun.TrainingFailedError`, whose ``result`` is the
        :class:`Result`, as Ray Train's ``fit()`` does."""
        # Workers import what this process can import.
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env = _from_ray.worker_env(self.run.worker_runtime_env) | dict(self.run.env)
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))]).rstrip(os.pathsep)
        run = self.run
        if run.storage_path is None:
            run = dataclasses.replace(run, storage_path=str(DEFAULTS["storage_path"]))
        # Every value is checked, by the engine, before anything starts.
        plan = _native.plan(
            self.scaling,
            run,
            _ours(self.run.checkpoint_config, CheckpointConfig, _from_ray.checkpoint_args) or CheckpointConfig(),
            _ours(self.run.failure_config, FailureConfig, _from_ray.failure_args) or FailureConfig(),
            env=sorted(env.items()),
            python=sys.executable,
            agent_command=[sys.executable, "-m", "meshrun"],
        )
        if self.datasets is not None:
            ray_data._check_datasets(self.datasets)
        payload = self._payload()
        s = self.scaling
        host = None if self.datasets is None else ray_data._Host(self.datasets, s.ray_address if s.backend == "ray" else None)
        try:
            out = _native.run(plan, payload=payload, env=[] if host is None else sorted(host.env.items()))
        finally:
            if host is not None:
                host.close()
        kept = _checkpoints(plan.checkpoints_dir)
        result = Result(
            metrics=out.metrics,
            path=os.fspath(out.run_dir),
            error=None if out.succeeded else RunFailedError(out.summary or f"run {out.name} {out.status}"),
            status=out.status,
            failure=out.failure,
            attempts=out.attempts,
            checkpoint=kept[-1][0] if kept else None,
            best_checkpoints=kept,
        )
        if out.failed:
            error = TrainingFailedError(f"run {out.name} failed after {out.attempts} attempt(s): {out.summary or 'see ' + result.path}")
            error.result = result
            raise error
        return result
