"""Ray Data interop: ``Trainer(..., datasets={"train": ds})`` and
:func:`get_dataset_shard` inside the training function.

meshrun's workers are not Ray processes (their agent is started by a Ray
actor, or by meshrun itself on the local backend), so a dataset cannot be
handed to them the way Ray Train hands it to its actors. Instead the
driver that calls ``fit()`` keeps the datasets in one small actor; each
worker joins the same Ray cluster and asks that actor for its split. The
actor cuts every dataset with ``streaming_split(world_size, equal=True)``
once per attempt, so every rank gets the same number of rows (SPMD steps
stay in lock step) and a restarted attempt gets fresh splits from the
start of the dataset. The rows themselves flow from Ray's object store to
the worker, not through the driver.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

from meshrun._native import ENV
from meshrun.context import get_context
from meshrun.errors import ConfigError

__all__ = ["get_dataset_shard"]

_NAMESPACE = "meshrun"
_ADDRESS_ENV = ENV["ray_data_address"]
_ACTOR_ENV = ENV["ray_data_actor"]

_shards: dict[str, Any] = {}


class _Datasets:
    """The actor's body: the datasets, and each attempt's splits."""

    def __init__(self, datasets: dict[str, Any]) -> None:
        self.datasets = datasets
        self.splits: dict[tuple[str, int], list[Any]] = {}

    def names(self) -> list[str]:
        return sorted(self.datasets)

    def split(self, name: str, attempt: int, rank: int, world_size: int) -> Any:
        if name not in self.datasets:
            return None
        key = (name, attempt)
        if key not in self.splits:
            # Splits of earlier attempts stream nothing more: let them go.
            for old in [k for k in self.splits if k[0] == name]:
                del self.splits[old]
            self.splits[key] = self.datasets[name].streaming_split(world_size, equal=True)
        return self.splits[key][rank]


def _check_datasets(datasets: Any) -> dict[str, Any]:
    """The ``datasets=`` argument: a dict of names to Ray Datasets."""
    if not isinstance(datasets, dict) or not datasets:
        raise ConfigError(f"Trainer datasets must be a non-empty dict of name -> ray.data.Dataset, got {type(datasets).__name__}")
    import ray.data

    for name, ds in datasets.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"Trainer datasets: names must be non-empty strings, got {name!r}")
        if not isinstance(ds, ray.data.Dataset):
            raise ConfigError(
                f"Trainer datasets[{name!r}] must be a ray.data.Dataset, got {type(ds).__name__}; "
                "for files on disk, meshrun.data.Loader reads them without Ray"
            )
    return datasets


class _Host:
    """Holds the datasets for one ``fit()``: joins Ray (the cluster the
    datasets belong to) unless this process already has, and starts the
    actor the workers ask for their splits. ``close()`` undoes both."""

    def __init__(self, datasets: dict[str, Any], ray_address: str | None) -> None:
        import ray

        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            ray.init(address=ray_address, logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
        gcs = ray.get_runtime_context().gcs_address
        if ray_address not in (None, "auto", "local") and not self.owns_ray and gcs != ray_address:
            raise ConfigError(
                f"this process is connected to the Ray cluster at {gcs}, but ScalingConfig.ray_address is {ray_address}; "
                "the datasets and the run must be on one cluster"
            )
        self.name = f"datasets-{uuid.uuid4().hex[:12]}"
        # Any: Ray's typing gives a handle whose methods have no .remote().
        actor: Any = ray.remote(num_cpus=0)(_Datasets)
        self.actor = actor.options(name=self.name, namespace=_NAMESPACE).remote(datasets)
        ray.get(self.actor.names.remote())
        self.env = {_ADDRESS_ENV: gcs, _ACTOR_ENV: self.name}

    def close(self) -> None:
        import ray

        ray.kill(self.actor)
        if self.owns_ray:
            ray.shutdown()


def get_dataset_shard(name: str = "train") -> Any:
    """This worker's part of ``datasets[name]`` given to ``Trainer``: Ray's
    ``DataIterator``, as Ray Train's ``get_dataset_shard`` returns it, so
    ``shard.iter_batches(batch_size=..., batch_format="numpy")`` yields
    dicts of numpy arrays for this process. Every rank gets the same number
    of rows; a restarted attempt starts the dataset over."""
    if name in _shards:
        return _shards[name]
    address, actor_name = os.environ.get(_ADDRESS_ENV), os.environ.get(_ACTOR_ENV)
    if not address or not actor_name:
        raise ConfigError(f"get_dataset_shard({name!r}): this run was given no datasets; pass Trainer(..., datasets={{{name!r}: ray_dataset}})")
    import ray

    if not ray.is_initialized():
        ray.init(address=address, namespace=_NAMESPACE, logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
    holder = ray.get_actor(actor_name, namespace=_NAMESPACE)
    ctx = get_context()
    shard: Any = ray.get(holder.split.remote(name, ctx.attempt, ctx.rank, ctx.world_size))
    if shard is None:
        raise ConfigError(f"get_dataset_shard({name!r}): no dataset of that name; the run has {ray.get(holder.names.remote())}")
    _shards[name] = shard
    return shard
