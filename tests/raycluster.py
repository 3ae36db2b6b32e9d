"""The Ray tests' two-node cluster: a Ray head on this machine and a second
node in a namespace host, started and stopped by the tests themselves
(test_ray.py's module fixture, which every test on the cluster shares)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, alive, wait_for
from nshosts import NsHosts, nshosts_unavailable
from ports import free_port

RAY = Path(sys.executable).parent / "ray"
PR_SET_PDEATHSIG = 1

# Every process of the test cluster carries this variable (with the
# cluster's id), so teardown finds the ones that left the session of the
# `ray start` that made them.
MARK = "MESHRUN_TEST_RAY_CLUSTER"
# A node's own processes start slowly on a busy machine.
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
# The node settings of both `ray start`s. Token authentication off: Ray
# turns it on when it finds a token in the home folder, which drivers that
# were not given it (the controller's placement process, the workers' Ray
# Data clients) could not present. No draining on SIGTERM: the node goes
# at once.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_USAGE_STATS_ENABLED": "0"}
NODE_ARGS = ["--num-cpus", "2", "--block", "--disable-usage-stats", "--include-log-monitor", "false"]

# Run in a process of its own: a driver's ray.init in the test process
# would keep later clusters in this process from starting actors.
NODES_UP = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False, configure_logging=False)
deadline = time.monotonic() + float(sys.argv[2])
while True:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) >= 2 or time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(json.dumps({n["NodeManagerAddress"]: n["Resources"].get("CPU") for n in nodes}))
"""


@dataclass
class TwoNodes:
    #: The head's GCS address, HOST:PORT.
    address: str
    #: The head's address (this machine's on the hosts' bridge), where the
    #: controller listens too.
    head_ip: str
    #: The other node's address (namespace host 0).
    node_ip: str
    hosts: NsHosts


# Runs argv with SIGTERM (which stops a `ray start --block` and its node)
# as its parent-death signal, so the nodes go even if the test process is
# SIGKILLed. It survives exec; nsenter, unshare and sh exec in turn, so in
# a host too the parent is the test process.
WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(%d, signal.SIGTERM, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    sys.exit("the test process is gone")
os.execv(sys.argv[2], sys.argv[2:])
""" % PR_SET_PDEATHSIG


def with_parent(argv: list[str]) -> list[str]:
    return [sys.executable, "-c", WITH_PARENT, str(os.getpid()), *argv]


def tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def marked_pids(mark: str, sessions: set[int]) -> list[int]:
    """Processes of the test cluster: in a session of its `ray start`s, or
    carrying its mark. Zombies are not counted."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            sid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3])
            environ = (entry / "environ").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if (sid in sessions or mark.encode() in environ.split(b"\0")) and alive(pid):
            found.append(pid)
    return found


def stop_nodes(procs: list[subprocess.Popen], mark: str) -> None:
    """SIGTERM to each `ray start --block`'s group (it stops its node's
    processes), SIGKILL to what is left of the groups after STOP_TIMEOUT_S,
    then to any process of the cluster still alive, by pid."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
    sessions = {p.pid for p in procs}
    deadline = time.monotonic() + 5
    while (left := marked_pids(mark, sessions)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not marked_pids(mark, sessions), 10, f"the test cluster's processes {left} to end")


@contextlib.contextmanager
def two_node_cluster(tmp_path_factory, compile_cache: Path) -> Iterator[TwoNodes]:
    """A Ray head here and a second node in a namespace host, 2 CPUs each:
    two `ray start --block` processes, each leading its own session. Their
    workers share the test session's compilation cache (see conftest's
    ``_own_scratch``)."""
    reason = nshosts_unavailable()
    if reason is not None:
        pytest.skip(f"no network namespaces: {reason}")
    cluster_id = secrets.token_hex(4)
    env = {**RAY_ENV, MARK: cluster_id, "JAX_COMPILATION_CACHE_DIR": str(compile_cache)}
    # The head node's agents keep their scratch here.
    scratch = tmp_path_factory.mktemp("head-scratch")
    hosts = NsHosts(1, compile_cache=compile_cache)
    procs: list[subprocess.Popen] = []
    temp = None
    try:
        # Unix socket paths in the session folder must stay under 108 bytes.
        temp = Path(tempfile.mkdtemp(prefix="mr-ray-", dir="/tmp"))
        head_ip, node_ip = hosts.controller_addr, hosts.addr(0)
        port = free_port(head_ip)
        address = f"{head_ip}:{port}"
        head_log, node_log = temp / "head.out", temp / "node.out"
        with head_log.open("w") as out:
            # Fixed default ports (client server, dashboard, its agent) are
            # replaced by free ones: another Ray on this machine may hold them.
            head = [
                str(RAY), "start", "--head", "--node-ip-address", head_ip, "--port", str(port), "--temp-dir", str(temp),
                "--include-dashboard", "false", "--dashboard-port", str(free_port("127.0.0.1")),
                "--ray-client-server-port", str(free_port(head_ip)), "--dashboard-agent-listen-port", str(free_port(head_ip)), *NODE_ARGS,
            ]  # fmt: skip
            procs.append(subprocess.Popen(with_parent(head), env={**os.environ, **env, "MESHRUN_SCRATCH": str(scratch)}, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

        def gcs_answers() -> bool:
            assert procs[0].poll() is None, f"the Ray head exited with {procs[0].returncode}:\n{tail(head_log)}"
            try:
                socket.create_connection((head_ip, port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_for(gcs_answers, START_TIMEOUT_S, f"the Ray head at {address}")
        with node_log.open("w") as out:
            procs.append(hosts.popen(0, with_parent([str(RAY), "start", "--address", address, "--node-ip-address", node_ip, *NODE_ARGS]), env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))
        up = subprocess.run([sys.executable, "-c", NODES_UP, address, str(START_TIMEOUT_S)], capture_output=True, text=True, timeout=START_TIMEOUT_S + 60, env={**os.environ, **RAY_ENV}, cwd=ROOT)
        nodes = json.loads(up.stdout.strip().splitlines()[-1]) if up.returncode == 0 and up.stdout.strip() else None
        assert nodes == {head_ip: 2.0, node_ip: 2.0}, f"cluster: {nodes}\n{up.stderr[-2000:]}\nhead:\n{tail(head_log)}\nnode:\n{tail(node_log)}"
        yield TwoNodes(address, head_ip, node_ip, hosts)
    finally:
        try:
            stop_nodes(procs, f"{MARK}={cluster_id}")
        finally:
            hosts.close()
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
