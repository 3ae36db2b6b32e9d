"""meshrun: run one sharded JAX program as N cooperating processes.

The package stays light on import (no JAX), because every worker and the
``meshrun`` command import it before anything else.
"""

from meshrun._native import __version__
from meshrun.checkpoint import Checkpoint, get_checkpoint, restore, save, wait_committed
from meshrun.context import Context, get_context, init
from meshrun.errors import CheckpointError, ConfigError, ControlError, DataError, MeshrunError, RunFailedError, StorageError, TrainingFailedError
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
    "StorageError",
    "Trainer",
    "TrainingFailedError",
    "__version__",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "init",
    "report",
    "restore",
    "save",
    "wait_committed",
]
