"""Hosts that share nothing, on one Linux machine: a test harness.

``NsHosts(count)`` makes ``count`` "hosts", each with

- its own network namespace holding ``lo`` (its own loopback) and ``eth0``
  with address ``10.R.0.(10+h)/24``, plugged into a bridge. The bridge lives
  in a namespace of its own (the "switch"), so bridged traffic never meets
  the root namespace's firewall or its ``bridge-nf-call-iptables`` setting;
  the root namespace is plugged in too and owns ``10.R.0.1``
  (``controller_addr``), for a controller run outside every host. Nothing
  is forwarded anywhere else: hosts have no default route.
- its own ``/tmp`` (seen from outside at ``tmp(h)``), its own scratch folder
  at the one path ``scratch_path`` in every host (outside at ``scratch(h)``,
  and in ``MESHRUN_SCRATCH``), its own hostname (``host-h``, resolvable by
  every host with ``controller``) and, unless told otherwise, the common
  ``shared`` folder at the same path inside and outside (a shared
  filesystem). The test session's compilation cache, where the
  environment names one, stays visible at its own path (``kept``).

Processes run in a host through ``popen``/``run``: ``nsenter`` into the
host's network namespace, then ``unshare`` a mount and UTS namespace of
their own in which the binds are made, so no mount is ever made in the root
namespace and nothing needs unmounting. ``nsenter`` is used rather than
``ip netns exec`` because the latter remounts ``/sys``, hiding the cgroup
filesystem a meshrun agent puts its workers in.

``close()`` (also run by ``with``, at interpreter exit, and by the
``nshosts`` pytest fixture) kills every process it started and every process
still inside one of its hosts, then deletes the namespaces and links it made
(by their exact names, which carry a per-harness random id) and its base
folder. It never touches anything it did not make.

Use from tests through the ``nshosts`` fixture; from bench scripts, put
this folder on ``sys.path`` and ``from nshosts import NsHosts``.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import ipaddress
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# Outside /tmp, because /tmp is replaced inside every host.
BASE_PARENT = Path("/var/tmp")


def _installed_under_tmp() -> list[Path]:
    """The checkout and the Python environment, where they lie under /tmp
    (a fresh clone in a temporary folder): every host has the program and
    its environment at the same path, as on a cluster, so these stay
    visible inside the hosts' private /tmp."""
    tmp = Path("/tmp").resolve()
    found: list[Path] = []
    for path in (Path(__file__).resolve().parent.parent, Path(sys.prefix).resolve()):
        if path.is_relative_to(tmp) and not any(path.is_relative_to(k) for k in found):
            found.append(path)
    return found


#: See ``_installed_under_tmp``; as paths relative to /tmp.
KEPT_UNDER_TMP = [p.relative_to(Path("/tmp").resolve()) for p in _installed_under_tmp()]


def _compile_cache_under_tmp(cache: str | os.PathLike | None) -> list[Path]:
    """The test session's JAX compilation cache, relative to /tmp where it
    lies there: hosts see it at its own path, as they see the program. A
    cached executable is the one a compile would give (JAX keys it by the
    program, the devices, the flags and its own version), so sharing it
    changes no result, only how often the same program is compiled."""
    if not cache:
        return []
    path, tmp = Path(cache).resolve(), Path("/tmp").resolve()
    return [path.relative_to(tmp)] if path.is_relative_to(tmp) and path.is_dir() else []


# Second octet of 10.R.0.0/24, drawn at random so concurrent harnesses
# (which also check the routing table) do not collide.
SUBNET_RANGE = range(200, 251)
FIRST_HOST_OCTET = 10
MAX_HOSTS = 254 - FIRST_HOST_OCTET
KILL_WAIT_S = 5.0


class NsHostsError(RuntimeError):
    """A command that builds or drives the hosts failed."""


def _sh(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NsHostsError(f"`{shlex.join(argv)}` exited with {done.returncode}: {done.stderr.strip()}")
    return done


@functools.cache
def nshosts_unavailable() -> str | None:
    """Why hosts cannot be made on this machine, or None when they can.

    Probes for real, inside a throwaway network namespace, so a missing
    veth or bridge driver is found here and not halfway through a test."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "nsenter", "mount", "sh"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = (
        "ip link add name a type veth peer name b"
        " && ip link add name br type bridge"
        " && ip link set dev a master br"
    )
    try:
        net = subprocess.run(["unshare", "--net", "sh", "-c", probe], capture_output=True, text=True, timeout=10)
        mnt = subprocess.run(["unshare", "--mount", "--uts", "--propagation", "private", "true"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot probe namespaces: {e}"
    if net.returncode != 0:
        return f"cannot make a network namespace with a veth and a bridge: {net.stderr.strip()}"
    if mnt.returncode != 0:
        return f"cannot make a mount namespace: {mnt.stderr.strip()}"
    if not BASE_PARENT.is_dir():
        return f"{BASE_PARENT} does not exist"
    return None


def _taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine routes or has an address in (the
    default route aside)."""
    routes = json.loads(_sh(["ip", "-4", "-json", "route", "show", "table", "all"]).stdout or "[]")
    links = json.loads(_sh(["ip", "-4", "-json", "addr", "show"]).stdout or "[]")
    nets = [ipaddress.ip_network(r["dst"], strict=False) for r in routes if r.get("dst", "default") != "default"]
    nets += [ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network for link in links for a in link.get("addr_info", [])]
    return nets


class NsHosts:
    """``count`` hosts that share nothing but a bridge and, if asked, the
    ``shared`` folder. See the module's docstring."""

    def __init__(self, count: int, *, shared: bool = True, without_shared: tuple[int, ...] | list[int] = (), compile_cache: str | os.PathLike | None = None):
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"count must be between 1 and {MAX_HOSTS}, got {count}")
        bad = [h for h in without_shared if not 0 <= h < count]
        if bad:
            raise ValueError(f"without_shared names hosts {bad}, but the hosts are 0..{count - 1}")
        self.count = count
        #: What stays visible at its own path in every host's /tmp: the
        #: program, and the test session's compilation cache
        #: (``compile_cache``, by default ``JAX_COMPILATION_CACHE_DIR``'s).
        self.kept = [*KEPT_UNDER_TMP, *_compile_cache_under_tmp(compile_cache or os.environ.get("JAX_COMPILATION_CACHE_DIR"))]
        self.id = secrets.token_hex(3)
        self.base = BASE_PARENT / f"meshrun-hosts-{self.id}"
        self.scratch_path = self.base / "scratch"
        self.shared: Path | None = self.base / "shared" if shared else None
        self._without_shared = frozenset(without_shared) if shared else frozenset()
        self.switch_ns = f"mr-{self.id}-sw"
        self.root_link = f"mr{self.id}c"
        self._made_ns: list[str] = []
        self._made_root_link = False
        self._made_base = False
        self._procs: list[subprocess.Popen] = []
        self._closed = False
        self.subnet: ipaddress.IPv4Network | None = None
        atexit.register(self.close)
        try:
            self._make_folders()
            self._make_network()
        except BaseException as e:
            self.__exit__(type(e), e, None)
            raise

    # ---- what tests read ------------------------------------------------

    def ns(self, h: int) -> str:
        """Name of host h's network namespace."""
        self._check_host(h)
        return f"mr-{self.id}-h{h}"

    def addr(self, h: int) -> str:
        """Host h's address on the bridge."""
        self._check_host(h)
        return str(self.subnet.network_address + FIRST_HOST_OCTET + h)

    @property
    def controller_addr(self) -> str:
        """The root namespace's address on the bridge."""
        return str(self.subnet.network_address + 1)

    def hostname(self, h: int) -> str:
        self._check_host(h)
        return f"host-{h}"

    def tmp(self, h: int) -> Path:
        """Outside path of host h's /tmp."""
        return self._host_dir(h) / "tmp"

    def written_to_tmp(self, h: int) -> list[Path]:
        """What host h has in its /tmp, less the mount points of the
        program and the compilation cache kept visible there (``kept``)."""
        kept = {self.tmp(h) / k for k in self.kept}
        parents = {p for k in kept for p in k.parents}
        return [p for p in self.tmp(h).rglob("*") if p not in kept and p not in parents and not any(p.is_relative_to(k) for k in kept)]

    def scratch(self, h: int) -> Path:
        """Outside path of host h's scratch folder (``scratch_path`` inside)."""
        return self._host_dir(h) / "scratch"

    def pids(self, h: int) -> list[int]:
        """Every process now inside host h's network namespace."""
        out = _sh(["ip", "netns", "pids", self.ns(h)], check=False).stdout
        return [int(p) for p in out.split()]

    def spares(self, h: int) -> list[int]:
        """The warm spare interpreters now running in host h."""
        found = []
        for pid in self.pids(h):
            try:
                if b"meshrun._spare" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                continue
        return found

    def env(self, h: int, extra: dict | None = None) -> dict:
        """The environment a process in host h gets: ours, less TMPDIR
        (which names our /tmp), plus MESHRUN_SCRATCH, the memory tier's
        folder in it (each host's own, as its shared memory would be), and
        then ``extra``. The session's compilation cache, when ours names
        one, stays (see ``kept``); without it each host keeps its own, in
        its scratch folder."""
        env = {k: v for k, v in os.environ.items() if k != "TMPDIR"}
        env["MESHRUN_SCRATCH"] = str(self.scratch_path)
        env["MESHRUN_MEMORY_DIR"] = str(self.scratch_path / "memory")
        env["HOSTNAME"] = self.hostname(h)
        env.update(extra or {})
        return env

    # ---- running things in a host ---------------------------------------

    def command(self, h: int, argv: list[str], cwd: str | os.PathLike | None = None) -> list[str]:
        """The command line that runs ``argv`` inside host h.

        The working directory is entered after the binds, so a ``cwd`` under
        /tmp or the scratch path means the host's own."""
        self._check_open()
        binds = []
        # The program stays where it is: held at a staging point while /tmp
        # is replaced, then put back at its own path.
        for i, kept in enumerate(self.kept):
            binds.append(f"mount --bind {shlex.quote(str(Path('/tmp') / kept))} {shlex.quote(str(self.base / 'kept' / str(i)))}")
        binds.append(f"mount --bind {shlex.quote(str(self.tmp(h)))} /tmp")
        for i, kept in enumerate(self.kept):
            binds.append(f"mount --bind {shlex.quote(str(self.base / 'kept' / str(i)))} {shlex.quote(str(Path('/tmp') / kept))}")
        binds += [
            f"mount --bind {shlex.quote(str(self.scratch(h)))} {shlex.quote(str(self.scratch_path))}",
            f"mount --bind {shlex.quote(str(self._host_dir(h) / 'hosts'))} /etc/hosts",
        ]
        if h in self._without_shared:
            binds.append(f"mount --bind {shlex.quote(str(self._host_dir(h) / 'no-shared'))} {shlex.quote(str(self.shared))}")
        # Hide every host's folders (its own included: it sees them at /tmp
        # and the scratch path) so a host cannot read another's by path.
        binds.append(f"mount -t tmpfs -o size=64k,mode=755 meshrun-hosts {shlex.quote(str(self.base / 'hosts'))}")
        binds.append(f"echo {self.hostname(h)} > /proc/sys/kernel/hostname")
        script = "set -e; " + "; ".join(binds) + '; cd "$1"; shift; exec "$@"'
        return [
            "nsenter", f"--net=/run/netns/{self.ns(h)}", "--",
            "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "sh", "-c", script, "meshrun-host", str(cwd or os.getcwd()), *map(str, argv),
        ]

    def popen(self, h: int, argv: list[str], *, env: dict | None = None, cwd: str | os.PathLike | None = None, **popen_kwargs) -> subprocess.Popen:
        """Starts ``argv`` inside host h, as the leader of a new session
        (so ``close`` can kill its whole group). ``env`` is merged onto
        ``env(h)``. Read its pipes before ``close``, which closes them."""
        popen_kwargs.pop("start_new_session", None)
        if "process_group" in popen_kwargs or "preexec_fn" in popen_kwargs:
            raise ValueError("popen makes every process a session leader itself; process_group/preexec_fn are not accepted")
        proc = subprocess.Popen(self.command(h, argv, cwd), env=self.env(h, env), cwd="/", start_new_session=True, **popen_kwargs)
        self._procs.append(proc)
        return proc

    def run(self, h: int, argv: list[str], *, env: dict | None = None, cwd: str | os.PathLike | None = None, check: bool = True, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
        """Runs ``argv`` inside host h to completion, output captured as text."""
        proc = self.popen(h, argv, env=env, cwd=cwd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if check:
            done.check_returncode()
        return done

    # ---- partitions -----------------------------------------------------

    def cut(self, h: int) -> None:
        """Unplugs host h from the bridge: nothing reaches it or leaves it
        (packets are dropped, so connects time out rather than fail fast)."""
        self._check_open()
        _sh(["ip", "-n", self.switch_ns, "link", "set", "dev", f"p{self._port(h)}", "down"])

    def restore(self, h: int) -> None:
        """Plugs host h back in."""
        self._check_open()
        _sh(["ip", "-n", self.switch_ns, "link", "set", "dev", f"p{self._port(h)}", "up"])

    def _port(self, h: int) -> int:
        self._check_host(h)
        return h

    # ---- teardown -------------------------------------------------------

    def close(self) -> None:
        """Kills what runs in the hosts, deletes what was made. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        errors = []
        for proc in self._procs:
            self._kill(proc)
        # Processes that left their session (meshrun's workers lead their
        # own groups) are still inside the host's namespace: find them there.
        host_ns = [ns for ns in self._made_ns if ns != self.switch_ns]
        deadline = time.monotonic() + KILL_WAIT_S
        while host_ns:
            left = [int(p) for ns in host_ns for p in _sh(["ip", "netns", "pids", ns], check=False).stdout.split()]
            if not left:
                break
            if time.monotonic() > deadline:
                errors.append(f"processes still in the hosts after SIGKILL: {left}")
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        for proc in self._procs:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        # Deleting a namespace frees its links asynchronously; the root end
        # is deleted first, by name, so it is gone when close returns.
        if self._made_root_link:
            done = _sh(["ip", "link", "del", "dev", self.root_link], check=False)
            if done.returncode != 0 and "Cannot find device" not in done.stderr:
                errors.append(done.stderr.strip())
        for ns in reversed(self._made_ns):
            done = _sh(["ip", "netns", "del", ns], check=False)
            if done.returncode != 0:
                errors.append(done.stderr.strip())
        self._made_ns.clear()
        if self._made_base:
            shutil.rmtree(self.base, ignore_errors=True)
            if self.base.exists():
                errors.append(f"could not remove {self.base}")
        if errors:
            raise NsHostsError("; ".join(errors))

    def __enter__(self) -> NsHosts:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
            return
        # The with-block's own failure is the one to report; a teardown
        # problem on top of it is attached to it, not put in its place.
        try:
            self.close()
        except NsHostsError as e:
            exc.add_note(f"and closing the hosts failed: {e}")

    # ---- building -------------------------------------------------------

    def _make_folders(self) -> None:
        self.base.mkdir(mode=0o755)
        self._made_base = True
        self.scratch_path.mkdir()
        if self.shared is not None:
            self.shared.mkdir()
        for h in range(self.count):
            d = self._host_dir(h)
            d.mkdir(parents=True)
            self.tmp(h).mkdir()
            # /tmp's usual mode: world-writable, sticky.
            self.tmp(h).chmod(0o1777)
            self.scratch(h).mkdir()
            (d / "no-shared").mkdir()
            for kept in self.kept:
                (self.tmp(h) / kept).mkdir(parents=True)
        for i in range(len(self.kept)):
            (self.base / "kept" / str(i)).mkdir(parents=True)

    def _make_network(self) -> None:
        # Choosing the subnet and claiming it (the root address) happen
        # under one lock, so two harnesses starting together cannot pick the
        # same one. /var/tmp is locked, not a file in it, to leave nothing.
        lock = os.open(BASE_PARENT, os.O_RDONLY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.subnet = self._free_subnet()
            self._add_ns(self.switch_ns)
            sw = ["ip", "-n", self.switch_ns]
            _sh(sw + ["link", "add", "name", "br", "type", "bridge"])
            _sh(["ip", "link", "add", "name", self.root_link, "type", "veth", "peer", "name", "ctl", "netns", self.switch_ns])
            self._made_root_link = True
            _sh(["ip", "addr", "add", f"{self.controller_addr}/{self.subnet.prefixlen}", "dev", self.root_link])
            _sh(["ip", "link", "set", "dev", self.root_link, "up"])
        finally:
            os.close(lock)
        # The switch is a fresh namespace: empty firewall. Bridged frames
        # skip even that, whatever br_netfilter's default there.
        knobs = " ".join(f"/proc/sys/net/bridge/bridge-nf-call-{t}" for t in ("iptables", "ip6tables", "arptables"))
        off = f"for k in {knobs}; do [ ! -e $k ] || echo 0 > $k; done"
        _sh(["nsenter", f"--net=/run/netns/{self.switch_ns}", "--", "sh", "-c", off])
        _sh(sw + ["link", "set", "dev", "ctl", "master", "br", "up"])
        _sh(sw + ["link", "set", "dev", "br", "up"])
        for h in range(self.count):
            ns = self.ns(h)
            self._add_ns(ns)
            _sh(sw + ["link", "add", "name", f"p{h}", "type", "veth", "peer", "name", "eth0", "netns", ns])
            _sh(sw + ["link", "set", "dev", f"p{h}", "master", "br", "up"])
            host = ["ip", "-n", ns]
            _sh(host + ["link", "set", "dev", "lo", "up"])
            _sh(host + ["addr", "add", f"{self.addr(h)}/{self.subnet.prefixlen}", "dev", "eth0"])
            _sh(host + ["link", "set", "dev", "eth0", "up"])
            names = [f"127.0.0.1 localhost {self.hostname(h)}", "::1 localhost", f"{self.controller_addr} controller"]
            names += [f"{self.addr(k)} {self.hostname(k)}" for k in range(self.count)]
            (self._host_dir(h) / "hosts").write_text("\n".join(names) + "\n")

    def _add_ns(self, ns: str) -> None:
        _sh(["ip", "netns", "add", ns])
        self._made_ns.append(ns)

    def _free_subnet(self) -> ipaddress.IPv4Network:
        taken = _taken_networks()
        choices = list(SUBNET_RANGE)
        random.shuffle(choices)
        for r in choices:
            net = ipaddress.ip_network(f"10.{r}.0.0/24")
            if not any(net.overlaps(t) for t in taken):
                return net
        raise NsHostsError(f"every subnet 10.R.0.0/24 with R in {SUBNET_RANGE.start}..{SUBNET_RANGE.stop - 1} is already routed on this machine")

    # ---- small helpers --------------------------------------------------

    def _host_dir(self, h: int) -> Path:
        self._check_host(h)
        return self.base / "hosts" / f"host-{h}"

    def _check_host(self, h: int) -> None:
        if not (isinstance(h, int) and 0 <= h < self.count):
            raise ValueError(f"no host {h!r}: the hosts are 0..{self.count - 1}")

    def _check_open(self) -> None:
        if self._closed:
            raise NsHostsError(f"harness {self.id} is closed")

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
