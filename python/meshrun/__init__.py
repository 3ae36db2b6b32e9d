"""meshrun: run one sharded JAX program as N cooperating processes.

The package stays light on import (no JAX), because every worker and the
``meshrun`` command import it before anything else.
"""

from meshrun._executables import eval_shape, jit
from meshrun._native import __version__
from meshrun.checkpoint import Checkpoint, get_checkpoint, restore, save, wait_committed
from meshrun.context import Context, get_context, init
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
from meshrun.ray_data import get_dataset_shard
from meshrun.reporting import report
from meshrun.trainer import CheckpointConfig, FailureConfig, Result, RunConfig, ScalingConfig, Trainer

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
