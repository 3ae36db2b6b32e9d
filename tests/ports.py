"""Ports for the suite's own servers (SeaweedFS, Ray heads).

A port found with `bind(0)` and let go is in the kernel's ephemeral range,
where any process's next `bind(0)` or outgoing connection may take it
before the server that was given it binds it (SeaweedFS and Ray start for
seconds). These come from below that range instead, where the kernel
hands out nothing by itself, and each xdist worker picks from its own
span, never one it gave before: only a server outside the suite could
still take one first.
"""

from __future__ import annotations

import os
import random
import socket

LOW, HIGH = 20000, 32000  # above Ray's worker ports (10002-19999)
_given: set[int] = set()


def _span() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    assert ephemeral >= HIGH, f"the kernel's ephemeral ports start at {ephemeral}, inside {LOW}-{HIGH}: see {__file__}"
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker.removeprefix("gw"))
    width = (HIGH - LOW) // workers
    return LOW + index * width, LOW + (index + 1) * width


def free_ports(n: int, ip: str = "127.0.0.1") -> list[int]:
    """n ports free on `ip` now, none given before in this process."""
    low, high = _span()
    candidates = [p for p in range(low, high) if p not in _given]
    random.shuffle(candidates)
    found: list[int] = []
    for port in candidates:
        with socket.socket() as probe:
            try:
                probe.bind((ip, port))
            except OSError:
                continue
        found.append(port)
        _given.add(port)
        if len(found) == n:
            return found
    raise AssertionError(f"only {len(found)} of {n} free ports on {ip} in {low}-{high}")


def free_port(ip: str = "127.0.0.1") -> int:
    return free_ports(1, ip)[0]
