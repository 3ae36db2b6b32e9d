"""Sharding rules and leaf paths, beneath both :mod:`meshrun.sharding`
(which applies them) and :mod:`meshrun.planning` (which lays them over
meshes that do not exist yet)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

Rules = Sequence[tuple[str, P]]


def path_str(path: tuple[Any, ...]) -> str:
    """``blocks/0/attn/q/kernel`` for a key path; NNX's trailing ``value`` dropped."""
    text = jax.tree_util.keystr(path, simple=True, separator="/")
    return text[: -len("/value")] if text.endswith("/value") else text


def spec_for(path: str, rules: Rules, default: P = P()) -> P:
    """The first rule whose pattern is found in ``path``, else ``default``."""
    for pattern, spec in rules:
        if re.search(pattern, path):
            return spec
    return default
