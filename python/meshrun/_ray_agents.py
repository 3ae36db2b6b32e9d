"""The Ray backend's placement: ``python -m meshrun._ray_agents ...``,
started by the controller for each attempt of a ``meshrun run --ray`` run.

It joins the Ray cluster as a driver, reserves a placement group with one
bundle per host (the CPUs and GPUs of that host's workers), and on each
bundle's node starts an actor that runs ``meshrun agent`` there: the same
Rust agent as the local backend, which dials the controller, proves the run
token and starts its workers. The agent dies with its actor (parent-death
signal), so a dead actor or node is a lost agent to the controller, which
restarts the attempt. This process lives as long as the attempt; when it
exits, Ray releases the actors and the bundles. Meanwhile it tells the
controller what the cluster holds back (see ``_ray_waiting``).

An elastic run (``--min-hosts``) asks for each host's bundle as a placement
group of its own and starts each host's agent as soon as its bundle is
placed: the controller sizes the attempt from the agents that come (at
least MIN), and a bundle placed later, when Ray has room, brings a host
that waits and makes the run grow at its next checkpoint.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from meshrun._native import DEFAULTS, ENV
from meshrun._ray_waiting import POLL_S, Watch

PR_SET_PDEATHSIG = 1


def _die(message: str, code: int = 2) -> None:
    print(f"meshrun: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fails fast with a clear message when ``HOST:PORT`` does not answer:
    ``ray.init`` would otherwise retry for minutes."""
    if address in ("auto", "local") or ":" not in address:
        return
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        _die(f"cannot reach the Ray cluster at {address} ({exc}); give the head node's HOST:PORT (as printed by `ray start --head`) or 'auto'")


def _with_parent() -> None:
    """In the agent, before exec: die when the actor that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="meshrun._ray_agents")
    ap.add_argument("--address", required=True)
    ap.add_argument("--strategy", default=DEFAULTS["ray_strategy"])
    ap.add_argument("--hosts", type=int, required=True)
    ap.add_argument("--cpus", type=float, required=True)
    ap.add_argument("--gpus", type=float, default=0)
    ap.add_argument("--controller", required=True, help="HOST:PORT the controller listens on")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the placement group (--start-timeout)")
    ap.add_argument("--min-hosts", type=int, help="an elastic run: one placement group per host, started as each is placed")
    args = ap.parse_args(argv)
    token = os.environ[ENV["token"]]
    _check_reachable(args.address)

    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    try:
        ray.init(address=args.address, logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
    except Exception as exc:  # Ray's own errors are many and version-specific
        _die(f"cannot join the Ray cluster at {args.address}: {exc}")

    class Agent:
        """Runs ``meshrun agent`` on its node until the agent exits."""

        def start(self, controller: str, host: int, token: str) -> tuple[str, str, int, int]:
            ip = ray.util.get_node_ip_address()
            env = {**os.environ, ENV["token"]: token}
            gpu_ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
            # The physical GPUs Ray gave this bundle, never 0..k-1.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)
            cmd = [sys.executable, "-m", "meshrun", "agent", "--controller", controller, "--host", str(host), "--host-ip", ip]
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, preexec_fn=_with_parent)
            return ip, ray.get_runtime_context().get_node_id(), os.getpid(), self.proc.pid

        def wait(self) -> int:
            return self.proc.wait()

    # ray.remote called rather than used as a decorator: the actor class is
    # the same, and mypy, which keeps a decorated class's own type, sees it.
    agent_actor = ray.remote(Agent)

    bundle = {"CPU": args.cpus, **({"GPU": args.gpus} if args.gpus else {})}
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    fits = [all(r.get(k, 0) >= v for k, v in bundle.items()) for r in nodes]
    if sum(fits) == 0 or (args.strategy == "STRICT_SPREAD" and sum(fits) < args.hosts):
        _die(
            f"no way to place {args.hosts} host(s) of {bundle} each ({args.strategy}) on this Ray cluster: "
            f"its nodes have {[{k: r.get(k, 0) for k in bundle} for r in nodes]}; lower -n per host, raise --hosts, or add nodes"
        )
    watch = Watch(ray.get_runtime_context().gcs_address)
    controller_host, port = args.controller.rsplit(":", 1)
    if controller_host in ("0.0.0.0", "[::]", "::"):
        # The controller listens everywhere: agents dial this machine as Ray knows it.
        controller_host = ray.util.get_node_ip_address()
    controller = f"{controller_host}:{port}"
    if args.min_hosts is not None:
        _elastic(args, bundle, controller, token, watch, agent_actor)
        ray.shutdown()
        return
    pg = placement_group([dict(bundle) for _ in range(args.hosts)], strategy=args.strategy)
    deadline = time.monotonic() + args.timeout
    ready = pg.ready()
    while not ray.wait([ready], timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))[0]:
        if time.monotonic() >= deadline:
            remove_placement_group(pg)
            _die(
                f"the Ray cluster cannot place {args.hosts} bundle(s) of {bundle} with strategy {args.strategy} "
                f"within {args.timeout:g} s (--start-timeout); it has {ray.available_resources()} available; "
                "lower -n or --hosts, free resources or add nodes"
            )
        watch.check()
    # Any: Ray types an actor handle's methods without their .remote().
    agents: list[Any] = [
        agent_actor.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=h),
            num_cpus=0,
            num_gpus=args.gpus,
        ).remote()
        for h in range(args.hosts)
    ]
    placed = ray.get([a.start.remote(controller, h, token) for h, a in enumerate(agents)])
    table = placement_group_table(pg)
    record = {
        "placement_group": pg.id.hex(),
        "strategy": args.strategy,
        "bundle": bundle,
        "hosts": [{"host": h, "ip": ip, "node_id": node, "actor_pid": actor, "agent_pid": pid} for h, (ip, node, actor, pid) in enumerate(placed)],
        "bundles_to_node_id": {str(k): v for k, v in table.get("bundles_to_node_id", {}).items()},
    }
    with open(os.path.join(args.run_dir, "ray-placement.json"), "w") as f:
        json.dump(record, f, indent=2)

    # Until every agent has exited (the attempt is over) or its actor died;
    # meanwhile the workers' own Ray work (Ray Data) may wait for resources.
    pending = {a.wait.remote(): h for h, a in enumerate(agents)}
    while pending:
        watch.check()
        _reap(pending)
    remove_placement_group(pg)
    ray.shutdown()


def _reap(pending: dict) -> None:
    """Waits up to ``POLL_S`` for an agent of ``pending`` (its wait ref ->
    its host) to exit and forgets it, saying so when its actor died."""
    import ray

    done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
    for ref in done:
        host = pending.pop(ref)
        try:
            ray.get(ref)
        except Exception as exc:  # Ray's actor errors are many and version-specific
            print(f"meshrun: the Ray actor of host {host}'s agent died: {type(exc).__name__}", file=sys.stderr, flush=True)


def _elastic(args, bundle: dict, controller: str, token: str, watch: Watch, Agent) -> None:
    """One placement group per host; each host's agent starts once its
    group is placed. Fewer than MIN placed by the start timeout ends this
    process with the reason; the attempt ends when every agent started has
    exited (those still waiting for room are then given up)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    groups = [placement_group([dict(bundle)]) for _ in range(args.hosts)]
    unplaced = {pg.ready(): h for h, pg in enumerate(groups)}
    running: dict = {}
    hosts: list[dict] = []
    deadline = time.monotonic() + args.timeout
    try:
        while True:
            placed, _ = ray.wait(list(unplaced), num_returns=len(unplaced), timeout=0) if unplaced else ([], [])
            for ref in placed:
                h = unplaced.pop(ref)
                agent = Agent.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=groups[h], placement_group_bundle_index=0),
                    num_cpus=0,
                    num_gpus=args.gpus,
                ).remote()
                ip, node, actor, pid = ray.get(agent.start.remote(controller, h, token))
                running[agent.wait.remote()] = h
                hosts.append({"host": h, "ip": ip, "node_id": node, "actor_pid": actor, "agent_pid": pid})
                with open(os.path.join(args.run_dir, "ray-placement.json"), "w") as f:
                    json.dump({"elastic": True, "bundle": bundle, "hosts": hosts}, f, indent=2)
            if len(hosts) < args.min_hosts and time.monotonic() >= deadline:
                _die(
                    f"the Ray cluster placed {len(hosts)} of the {args.min_hosts} host bundle(s) of {bundle} the run needs at least "
                    f"within {args.timeout:g} s (--start-timeout); it has {ray.available_resources()} available; "
                    "lower MIN, free resources or add nodes"
                )
            watch.check()
            if not running:
                # Nothing placed yet: wait for the first group.
                ray.wait(list(unplaced), num_returns=1, timeout=POLL_S)
                continue
            _reap(running)
            if not running:
                # Every agent started has exited: the attempt is over.
                return
    finally:
        for pg in groups:
            remove_placement_group(pg)


if __name__ == "__main__":
    main(sys.argv[1:])
