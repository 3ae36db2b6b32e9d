"""The namespace-hosts harness keeps its promises: hosts reach each other
and the controller address and nothing of the root's loopback, /tmp and
scratch are each host's own, the shared folder is shared (except where
hidden), a cut host is unreachable until restored, and close leaves
nothing behind, even when the test failed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import alive, wait_for
from nshosts import NsHosts

# Serves argv[2] to every connection on (argv[1], a free port); prints the port.
SERVE = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[2].encode())
    c.close()
"""

# Connects to (argv[1], argv[2]) within argv[3] seconds; prints what it got
# or how it failed.
DIAL = """
import errno, socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    print("got " + c.recv(100).decode())
except socket.timeout:
    print("timeout")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e)))
"""


def serve(hosts: NsHosts, h: int, addr: str, reply: str) -> int:
    """Starts a server inside host h; returns its port once it listens."""
    proc = hosts.popen(h, [sys.executable, "-S", "-c", SERVE, addr, reply], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip().isdigit(), f"server in host {h} did not start: {line!r}"
    return int(line)


def dial(hosts: NsHosts, h: int, addr: str, port: int, timeout: float = 1.0) -> str:
    return hosts.run(h, [sys.executable, "-S", "-c", DIAL, addr, str(port), str(timeout)]).stdout.strip()


def root_listener(addr: str) -> socket.socket:
    s = socket.socket()
    s.bind((addr, 0))
    s.listen()
    s.settimeout(0.3)
    return s


def leftovers(hosts: NsHosts) -> list[str]:
    """Every namespace, link or folder with the harness's id still present."""
    found = []
    for cmd in (["ip", "netns", "list"], ["ip", "-o", "link"]):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        found += [line for line in out.splitlines() if hosts.id in line]
    if hosts.base.exists():
        found.append(str(hosts.base))
    return found


def test_hosts_reach_each_other_and_the_controller_address(nshosts):
    hosts = nshosts(2)
    port = serve(hosts, 0, hosts.addr(0), "from-h0")
    assert dial(hosts, 1, hosts.addr(0), port) == "got from-h0"
    # Hostnames resolve in every host, and name the host's own address.
    assert dial(hosts, 1, "host-0", port) == "got from-h0"
    assert hosts.run(1, ["hostname"]).stdout.strip() == "host-1"

    with root_listener(hosts.controller_addr) as listener:
        client = hosts.popen(1, [sys.executable, "-S", "-c", DIAL, hosts.controller_addr, str(listener.getsockname()[1]), "1"], stdout=subprocess.PIPE, text=True)
        listener.settimeout(5)
        conn, (peer, _) = listener.accept()
        conn.sendall(b"from-root")
        conn.close()
        assert client.stdout.read().strip() == "got from-root"
    # The connection came from host 1's own address, not the root's.
    assert peer == hosts.addr(1)


def test_loopback_is_each_hosts_own(nshosts):
    hosts = nshosts(2)
    with root_listener("127.0.0.1") as listener:
        root_port = listener.getsockname()[1]
        assert dial(hosts, 0, "127.0.0.1", root_port) == "ECONNREFUSED"
        with pytest.raises(socket.timeout):
            listener.accept()

    # The host's loopback is up and serves the host itself, and only it.
    port = serve(hosts, 0, "127.0.0.1", "h0-local")
    assert dial(hosts, 0, "127.0.0.1", port) == "got h0-local"
    assert dial(hosts, 1, "127.0.0.1", port) == "ECONNREFUSED"


def test_tmp_is_private_to_each_host(nshosts, monkeypatch):
    hosts = nshosts(2)
    # A TMPDIR of ours that the hosts could use, were it passed on.
    monkeypatch.setenv("TMPDIR", str(hosts.base))
    name = f"mark-{hosts.id}"
    hosts.run(0, ["sh", "-c", f"echo written-by-h0 > /tmp/{name}"])

    assert (hosts.tmp(0) / name).read_text() == "written-by-h0\n"
    assert not (Path("/tmp") / name).exists()
    # Host 1's /tmp holds nothing but the checkout and the session's
    # compilation cache kept at their paths (where they lie under /tmp).
    kept = {str(k).split("/")[0] for k in hosts.kept}
    assert set(hosts.run(1, ["ls", "-A", "/tmp"]).stdout.split()) == kept
    assert not (hosts.tmp(1) / name).exists()
    # Python's temporary files land in the host's /tmp, not in a TMPDIR
    # inherited from outside.
    where = hosts.run(0, [sys.executable, "-S", "-c", "import os, tempfile; print(os.environ.get('TMPDIR'), tempfile.gettempdir())"]).stdout.split()
    assert where == ["None", "/tmp"]


def test_scratch_is_one_path_with_each_hosts_contents(nshosts):
    hosts = nshosts(2)
    for h in range(2):
        hosts.run(h, ["sh", "-c", f'echo {h} > "$MESHRUN_SCRATCH/who"'])
    for h in range(2):
        inside = hosts.run(h, ["sh", "-c", 'echo "$MESHRUN_SCRATCH"; cat "$MESHRUN_SCRATCH/who"']).stdout.split()
        assert inside == [str(hosts.scratch_path), str(h)]
        assert (hosts.scratch(h) / "who").read_text() == f"{h}\n"
    # Outside every host, the common path holds nothing.
    assert list(hosts.scratch_path.iterdir()) == []


def test_shared_folder_is_shared_except_where_hidden(nshosts):
    hosts = nshosts(3, without_shared=[2])
    hosts.run(0, ["sh", "-c", f"echo ckpt > {hosts.shared}/step-1"])
    assert hosts.run(1, ["cat", f"{hosts.shared}/step-1"]).stdout == "ckpt\n"
    assert (hosts.shared / "step-1").read_text() == "ckpt\n"

    # Host 2 sees an empty folder of its own there: what it writes stays
    # with it.
    assert hosts.run(2, ["ls", "-A", str(hosts.shared)]).stdout == ""
    hosts.run(2, ["sh", "-c", f"echo lost > {hosts.shared}/from-h2"])
    assert not (hosts.shared / "from-h2").exists()
    assert hosts.run(0, ["ls", "-A", str(hosts.shared)]).stdout == "step-1\n"


def test_a_cut_host_is_unreachable_until_restored(nshosts):
    hosts = nshosts(2)
    port = serve(hosts, 1, hosts.addr(1), "from-h1")
    assert dial(hosts, 0, hosts.addr(1), port) == "got from-h1"

    hosts.cut(1)
    started = time.monotonic()
    # Dropped, not refused: a partition looks like silence.
    assert dial(hosts, 0, hosts.addr(1), port, timeout=1.0) in ("timeout", "EHOSTUNREACH")
    assert time.monotonic() - started < 5
    assert dial(hosts, 1, hosts.controller_addr, 9, timeout=1.0) in ("timeout", "EHOSTUNREACH")

    hosts.restore(1)
    assert dial(hosts, 0, hosts.addr(1), port, timeout=5.0) == "got from-h1"


def test_concurrent_harnesses_do_not_meet(nshosts):
    a, b = nshosts(1), nshosts(1)
    assert a.id != b.id and a.subnet != b.subnet
    port = serve(b, 0, b.addr(0), "from-b")
    assert dial(a, 0, b.addr(0), port) == "ENETUNREACH"
    a.close()
    assert dial(b, 0, b.addr(0), port) == "got from-b"


def start_sleepers(hosts: NsHosts) -> list[int]:
    """In every host: a sleeper started by the harness, and one that left
    its session (as meshrun's workers do); returns their pids."""
    pids = []
    for h in range(hosts.count):
        proc = hosts.popen(h, ["sh", "-c", "setsid sleep 600 & echo $!; exec sleep 600"], stdout=subprocess.PIPE, text=True)
        escaped = int(proc.stdout.readline())
        wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text() == "sleep\n", 5, "the host's command to exec")
        pids += [proc.pid, escaped]
        assert set(hosts.pids(h)) >= {proc.pid, escaped}
    return pids


def test_close_leaves_nothing(nshosts):
    hosts = nshosts(2)
    pids = start_sleepers(hosts)
    assert leftovers(hosts)
    hosts.close()
    assert [p for p in pids if alive(p)] == []
    assert leftovers(hosts) == []


def test_close_leaves_nothing_when_the_test_raised():
    from nshosts import nshosts_unavailable

    if (reason := nshosts_unavailable()) is not None:
        pytest.skip(reason)
    with pytest.raises(RuntimeError, match="the test failed"):
        with NsHosts(2) as hosts:
            pids = start_sleepers(hosts)
            raise RuntimeError("the test failed")
    assert [p for p in pids if alive(p)] == []
    assert leftovers(hosts) == []
