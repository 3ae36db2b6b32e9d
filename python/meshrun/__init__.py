"""meshrun: run one sharded JAX program as N cooperating processes.

The package stays light on import (no JAX, and each name's module only at
its first use), because every worker and the ``meshrun`` command import it
before anything else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from meshrun._native import __version__
from meshrun.errors import (
    CheckpointError,
    ConfigError,
    ControlError,
    DataError,
    MeshrunError,
    RunFailedError,
    StaleExecutableError,
    StorageError,
    TrainingFailedError,
)

if TYPE_CHECKING:
    from meshrun._executables import eval_shape, jit
    from meshrun.checkpoint import Checkpoint, get_checkpoint, restore, save, wait_committed
    from meshrun.context import Context, get_context, init
    from meshrun.ray_data import get_dataset_shard
    from meshrun.reporting import report
    from meshrun.trainer import CheckpointConfig, FailureConfig, Result, RunConfig, ScalingConfig, Trainer

# Each name's module, imported at the name's first use (PEP 562; the
# exceptions above are _native's, loaded already): every worker and every
# ``meshrun`` command imports this package first, and most use little of it
# (``checkpoint`` brings numpy, ``trainer`` more).
_HOME = {
    **dict.fromkeys(["eval_shape", "jit"], "_executables"),
    **dict.fromkeys(["Checkpoint", "get_checkpoint", "restore", "save", "wait_committed"], "checkpoint"),
    **dict.fromkeys(["Context", "get_context", "init"], "context"),
    "get_dataset_shard": "ray_data",
    "report": "reporting",
    **dict.fromkeys(["CheckpointConfig", "FailureConfig", "Result", "RunConfig", "ScalingConfig", "Trainer"], "trainer"),
}


# Modules that ``meshrun.NAME`` reaches after a bare ``import meshrun``.
_MODULES = frozenset(["checkpoint", "context", "data", "elastic", "planning", "ray_data", "reporting", "sharding", "trainer"])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"meshrun.{name}")
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'meshrun' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"meshrun.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_MODULES})


__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointError",
    "ConfigError",
    "Context",
    "ControlError",
    "DataError",
    "FailureConfig",
    "MeshrunError",
    "Result",
    "RunConfig",
    "RunFailedError",
    "ScalingConfig",
    "StaleExecutableError",
    "StorageError",
    "Trainer",
    "TrainingFailedError",
    "__version__",
    "eval_shape",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "init",
    "jit",
    "report",
    "restore",
    "save",
    "wait_committed",
]
