"""Ray Train's names where they mean the same thing in meshrun: its
``ScalingConfig``, ``RunConfig``, ``FailureConfig`` and ``CheckpointConfig``
objects converted (with one note on stderr), ``resources_per_worker`` and
``worker_runtime_env`` taken apart. A Ray name with no meaning here is an
error that says what to use instead."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from meshrun._native import DEFAULTS
from meshrun.errors import ConfigError

__all__: list[str] = []

_noted: set[str] = set()


def is_ray(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "ray"


def note(ray_name: str, ours: Any) -> None:
    if ray_name not in _noted:
        _noted.add(ray_name)
        print(f"meshrun: took Ray's {ray_name} as {ours!r}; meshrun's own class (meshrun.{ray_name.rsplit('.', 1)[-1]}) says the same", file=sys.stderr)


def _set(obj: Any, name: str) -> Any:
    """The field's value when it differs from Ray's default, else None."""
    value = getattr(obj, name, None)
    fields = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
    f = fields.get(name)
    if f is not None and f.default is not dataclasses.MISSING and value == f.default:
        return None
    if f is not None and f.default_factory is not dataclasses.MISSING and value == f.default_factory():
        return None
    return value


def _refuse(ray_name: str, obj: Any, names: dict[str, str]) -> None:
    for name, instead in names.items():
        # Empty values (None, [], {}) are what Ray fills in by itself.
        if _set(obj, name):
            raise ConfigError(f"{ray_name}.{name} has no meaning in meshrun ({getattr(obj, name)!r} given): {instead}")


def scaling_args(s: Any) -> dict[str, Any]:
    """meshrun's ``ScalingConfig`` arguments for Ray's."""
    _refuse("ray.train.ScalingConfig", s, {
        "trainer_resources": "the driver (this process) runs the controller and needs no Ray resources",
        "accelerator_type": "place workers on such nodes with Ray labels or a cluster of those nodes",
        "label_selector": "use a Ray cluster whose nodes are the ones to train on",
        "topology": "meshrun derives TPU placement from the hosts it is given",
    })  # fmt: skip
    import ray

    return {
        "num_workers": s.num_workers or 1,
        "use_gpu": bool(s.use_gpu),
        "resources_per_worker": dict(s.resources_per_worker) if s.resources_per_worker else None,
        "platform": "tpu" if getattr(s, "use_tpu", False) else None,
        "backend": "ray" if ray.is_initialized() else "local",
        "ray_address": "auto" if ray.is_initialized() else None,
        "ray_strategy": str(s.placement_strategy or DEFAULTS["ray_strategy"]),
    }


def failure_args(f: Any) -> dict[str, Any]:
    """meshrun's ``FailureConfig`` arguments for Ray's."""
    if f.max_failures is not None and f.max_failures < 0:
        raise ConfigError("ray.train.FailureConfig(max_failures=-1) (retry forever) has no meshrun equivalent: give the number of restarts allowed")
    return {"max_failures": f.max_failures or 0}


def checkpoint_args(c: Any) -> dict[str, Any]:
    """meshrun's ``CheckpointConfig`` arguments for Ray's."""
    _refuse("ray.train.CheckpointConfig", c, {
        "checkpoint_frequency": "checkpoints are what report(checkpoint=...) is given; CheckpointConfig(every_n_steps=N) thins them",
        "checkpoint_at_end": "report a checkpoint at the last step",
    })  # fmt: skip
    order = str(c.checkpoint_score_order or DEFAULTS["score_order"]).lower()
    return {"num_to_keep": c.num_to_keep, "score_attribute": c.checkpoint_score_attribute, "score_order": order}


def run_args(r: Any) -> dict[str, Any]:
    """meshrun's ``RunConfig`` arguments for Ray's (its failure and
    checkpoint configs stay Ray's, to be converted in turn)."""
    _refuse("ray.train.RunConfig", r, {
        "storage_filesystem": "give storage_path as a URL (s3://bucket/prefix); credentials come from AWS_* variables or a profile",
        "callbacks": "meshrun writes metrics.jsonl, events.jsonl and report.html; RunConfig(tensorboard=True) writes TensorBoard files",
        "stop": "end the training loop in your function",
        "sync_config": "checkpoints go straight to storage_path",
        "progress_reporter": "RunConfig(progress=...) turns the progress line on or off",
    })  # fmt: skip
    return {
        "name": r.name,
        "storage_path": os.fspath(r.storage_path) if r.storage_path else str(DEFAULTS["storage_path"]),
        "failure_config": r.failure_config,
        "checkpoint_config": r.checkpoint_config,
        "worker_runtime_env": dict(r.worker_runtime_env) if getattr(r, "worker_runtime_env", None) else None,
    }


def worker_env(runtime_env: dict[str, Any] | None) -> dict[str, str]:
    """The environment variables of a Ray ``runtime_env``; its other keys
    have no meaning for processes meshrun starts."""
    if not runtime_env:
        return {}
    if not isinstance(runtime_env, dict):
        raise ConfigError(f"RunConfig.worker_runtime_env must be a dict like {{'env_vars': {{'NAME': 'value'}}}}, got {type(runtime_env).__name__}")
    other = sorted(k for k in runtime_env if k != "env_vars")
    if other:
        raise ConfigError(
            f"RunConfig.worker_runtime_env: only 'env_vars' is taken (also given: {', '.join(other)}); meshrun's workers import what "
            "this process imports (its sys.path goes with them): install packages on every host, and use RunConfig(env=...) for variables"
        )
    env = runtime_env["env_vars"] or {}
    bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise ConfigError(f"RunConfig.worker_runtime_env['env_vars'] must map names to strings, got {bad[0]!r}: {env[bad[0]]!r}")
    return dict(env)


def resources(s: Any) -> tuple[float | None, int | None]:
    """(CPUs, GPUs) per worker from ``ScalingConfig.resources_per_worker``."""
    wanted = s.resources_per_worker
    if not wanted:
        return None, None
    if not isinstance(wanted, dict):
        raise ConfigError(f"ScalingConfig.resources_per_worker must be a dict like {{'CPU': 2, 'GPU': 1}}, got {type(wanted).__name__}")
    other = sorted(k for k in wanted if k not in ("CPU", "GPU"))
    if other:
        raise ConfigError(f"ScalingConfig.resources_per_worker: meshrun places workers by 'CPU' and 'GPU' counts; got {', '.join(map(repr, other))} too")
    cpus, gpus = wanted.get("CPU"), wanted.get("GPU")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus <= 0):
        raise ConfigError(f"ScalingConfig.resources_per_worker['CPU'] must be a positive number, got {cpus!r}")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus < 0 or gpus != int(gpus)):
        raise ConfigError(f"ScalingConfig.resources_per_worker['GPU'] must be a whole number of GPUs (workers never share one), got {gpus!r}")
    if gpus is not None and s.gpus_per_worker is not None and int(gpus) != s.gpus_per_worker:
        raise ConfigError(f"ScalingConfig: resources_per_worker['GPU'] = {gpus} and gpus_per_worker = {s.gpus_per_worker} disagree; give one")
    return (None if cpus is None else float(cpus)), (None if gpus is None else int(gpus))
