"""The exceptions meshrun raises, all subclasses of :class:`MeshrunError`.

They are defined by the native engine, which turns each of its errors into
exactly one of these (crates/meshrun-python/src/errors.rs).
"""

from meshrun._native import (
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

__all__ = [
    "CheckpointError",
    "ConfigError",
    "ControlError",
    "DataError",
    "MeshrunError",
    "RunFailedError",
    "StaleExecutableError",
    "StorageError",
    "TrainingFailedError",
]
