"""``meshrun run`` across hosts that share nothing (see nshosts.py): the
controller runs in host 0 with ``--listen`` on host 0's address, every other
host joins with ``meshrun join``, checkpoints go to the harness's shared
folder (the run's ``--storage``), and the run folder stays in host 0's
private ``/tmp`` (read from outside at ``hosts.tmp(0)``)."""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from conftest import MESHRUN, ROOT, Finished, assert_none_left
from nshosts import NsHosts

# Each harness has network namespaces of its own: one port serves all.
PORT = 29400


@dataclass
class HostsRun(Finished):
    #: ``--storage``'s folder of this run (outside path: the shared folder).
    storage_dir: Path | None = None
    #: (exit status, output) of each joining host's ``meshrun join``.
    joins: list[tuple[int, str]] = field(default_factory=list)


def listen_addr(hosts: NsHosts) -> str:
    return f"{hosts.addr(0)}:{PORT}"


def run_args(hosts: NsHosts, args: list[str], name: str, *, count: int | None = None) -> list[str]:
    """The controller's command line in host 0, for ``count`` hosts (all of
    the harness's by default)."""
    return [str(MESHRUN), "run", "--runs-dir", "/tmp/runs", "--name", name, "--hosts", str(count or hosts.count), "--listen", listen_addr(hosts), "--storage", str(hosts.shared), *args]


def start_joins(hosts: NsHosts, env: dict, timeout: float = 60) -> list[subprocess.Popen]:
    return [
        hosts.popen(h, [str(MESHRUN), "join", listen_addr(hosts), "--join-timeout", str(timeout)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for h in range(1, hosts.count)
    ]


def meshrun_on(hosts: NsHosts, args: list[str], *, name: str = "t", timeout: float = 300, env: dict | None = None) -> HostsRun:
    """Runs ``meshrun run ARGS`` on every host to completion."""
    env = {"MESHRUN_TOKEN": secrets.token_hex(32), **(env or {})}
    controller = hosts.popen(0, run_args(hosts, args, name), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    joins = start_joins(hosts, env)
    out, err = controller.communicate(timeout=timeout)
    joined = []
    for j in joins:
        text, _ = j.communicate(timeout=30)
        joined.append((j.returncode, text))
    run_dir = hosts.tmp(0) / "runs" / name
    if run_dir.exists():
        assert_none_left(run_dir)
    return HostsRun(controller.returncode, out, err, run_dir, storage_dir=hosts.shared / name, joins=joined)
