"""Values as the engine takes them: dicts with string keys, lists, strings,
numbers, booleans and ``None``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def plain(value: Any) -> Any:
    """``value`` with every part the engine cannot take made plain, as
    ``json.dumps`` with a default would: scalars of numpy or JAX become
    numbers (``.item()``), arrays nested lists (``.tolist()``), tuples
    lists, anything else its ``str``. Keys become strings as JSON writes
    them (``1`` -> ``"1"``); a key of another type raises ``TypeError``."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {_key(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if getattr(value, "ndim", None) == 0 or getattr(value, "size", None) == 1:
        return plain(value.item())
    if hasattr(value, "tolist"):
        return plain(value.tolist())
    return str(value)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
