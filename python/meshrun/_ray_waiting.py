"""What a Ray cluster holds back from a run, for the controller's status
line and its start timeout.

The placing process (``meshrun._ray_agents``) asks the cluster's GCS for
its status every couple of seconds while the attempt lives (the same call
``ray status`` makes; no dashboard needed) and prints a line
``meshrun-waiting: WHAT`` on stderr each time what waits changes, or
``meshrun-waiting:`` alone once nothing does. The controller reads those
lines. Ray's status does not say whose demand it is: on a cluster shared
with other jobs, their waiting work is named too.
"""

from __future__ import annotations

import sys
from typing import Any

PREFIX = "meshrun-waiting:"

#: How often the cluster is asked.
POLL_S = 2.0


def _shape(bundle: dict[str, float]) -> str:
    return str({k: bundle[k] for k in sorted(bundle) if bundle[k]})


def _free(usage: list[Any]) -> str:
    """``CPU 0 of 4, GPU 1 of 8`` from the cluster's resource usage."""
    have = {u.resource_name: u for u in usage}
    parts = [f"{name} {have[name].total - have[name].used:g} of {have[name].total:g}" for name in ("CPU", "GPU") if name in have and have[name].total]
    return ", ".join(parts) or "nothing"


def describe(status: Any) -> str | None:
    """One line on what the cluster cannot run yet, with what it has
    free; ``None`` when nothing waits. ``status`` is Ray's
    ``ClusterStatus`` (``ray.autoscaler.v2.sdk.get_cluster_status``)."""
    demand = status.resource_demands
    parts = []
    for pg in demand.placement_group_demand:
        bundles = ", ".join(f"{b.count} x {_shape(b.bundle)}" for b in pg.bundles_by_count)
        parts.append(f"a placement group of {bundles}" + (f" ({pg.strategy})" if pg.strategy else ""))
    tasks: dict[str, int] = {}
    for d in demand.ray_task_actor_demand:
        for b in d.bundles_by_count:
            tasks[_shape(b.bundle)] = tasks.get(_shape(b.bundle), 0) + b.count
    for shape, n in sorted(tasks.items()):
        parts.append(f"{n} Ray task{'s' if n != 1 else ''} or actor{'s' if n != 1 else ''} of {shape}")
    if not parts:
        return None
    return f"{'; '.join(parts)} (free: {_free(status.cluster_resource_usage)})"


class Watch:
    """Says what waits, each time that changes. A wait is said once it has
    been seen twice in a row: work the cluster can run waits a moment too."""

    def __init__(self, gcs_address: str) -> None:
        self.gcs_address = gcs_address
        self.said: str | None = None
        self.seen: str | None = None

    def check(self) -> None:
        from ray.autoscaler.v2.sdk import get_cluster_status

        try:
            what = describe(get_cluster_status(self.gcs_address))
        except Exception:  # best effort: a status the GCS cannot give is no wait
            return
        seen, self.seen = self.seen, what
        if what is not None and seen is None:
            return
        if what != self.said:
            self.said = what
            print(f"{PREFIX} {what or ''}".rstrip(), file=sys.stderr, flush=True)
