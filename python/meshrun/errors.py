"""The exceptions meshrun raises, all subclasses of :class:`MeshrunError`.

They are defined by the native engine, so an engine error arrives in Python
as exactly one of these.
"""

from meshrun._native import CheckpointError, ConfigError, ControlError, DataError, MeshrunError, RunFailedError

__all__ = ["CheckpointError", "ConfigError", "ControlError", "DataError", "MeshrunError", "RunFailedError"]
