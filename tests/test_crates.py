"""Which crate depends on what: the engine's crates (supervision, the
control protocol, data loading, checkpoint I/O) carry no web server, no
renderer and no Python binding; those sit in crates of their own. The
arrows between the engine's crates run one way: protocol below channel,
worker and planning; planning below the controller's state machine and
the agent; the machine and the agent below the engine that drives them;
and the machine builds with no I/O at all. Read from ``cargo tree`` over the lock file, so a dependency
added to the wrong crate fails here."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import ROOT

# The web server, the renderer and the binding, by package name. An HTTP
# client stack (hyper, tower) is not among them: the object-storage client
# that checkpoints and data read through is built on one.
WEB = {"axum", "axum-core", "matchit"}
RENDERING = {"meshrun-report", "meshrun-serve"}
BINDING = {"pyo3", "numpy", "meshrun-python"}

# The control protocol as data (messages, frames, token, env names): the
# run directory's types beside it, nothing that does I/O.
PROTOCOL_MESHRUN = {"meshrun-protocol", "meshrun-record"}

# Its connections: the Noise handshake and the sealed channel.
CHANNEL_MESHRUN = PROTOCOL_MESHRUN | {"meshrun-channel"}

# The worker's client, inside every training process: the protocol, its
# connections and the checkpoint crates (it reads what it resumes from),
# never planning, the controller or the agent.
WORKER_MESHRUN = CHANNEL_MESHRUN | {"meshrun-worker", "meshrun-ckpt", "meshrun-store"}

# Planning: the plan's checks read checkpoints and probe object stores, so
# the checkpoint crates are below it; never the machine or the engine that
# drives it (the circle the planning crate was split out to end).
PLAN_MESHRUN = PROTOCOL_MESHRUN | {"meshrun-plan", "meshrun-ckpt", "meshrun-store"}

# The controller's state machine: the plan's types, the protocol's
# messages, the run directory's types. Nothing else of meshrun.
MACHINE_MESHRUN = PROTOCOL_MESHRUN | {"meshrun-machine", "meshrun-plan"}

# The agent, one per host: it speaks the protocol over its connections,
# reports the host's GPUs (planning's inventory) and holds checkpoint copies
# for the memory tier; never the controller's machine or its drivers.
AGENT_MESHRUN = CHANNEL_MESHRUN | {"meshrun-agent", "meshrun-plan", "meshrun-ckpt", "meshrun-store"}

# What does I/O: an async runtime, sockets, an HTTP or object-store client.
IO_PACKAGES = {"tokio", "mio", "socket2", "hyper", "reqwest", "object_store", "snow", "futures-io"}


def _packages(crate: str, depth: int | None = None, features: str = "") -> set[str]:
    """The names of every package ``crate`` builds with (normal and build
    dependencies, not dev ones), itself included; with ``depth`` 1, only
    those it names itself. With ``features`` "none", as built without its
    default features; with "show", each enabled feature as ``package
    feature "name"``."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.fail("cargo is not on PATH: the dependency check reads `cargo tree`")
    limit = [] if depth is None else ["--depth", str(depth)]
    edges = "normal,build,features" if features == "show" else "normal,build"
    extra = ["--no-default-features"] if features == "none" else []
    out = subprocess.run(
        [cargo, "tree", "--offline", "--locked", "-p", crate, "-e", edges, "--prefix", "none", "--format", "{p}", *limit, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    if features == "show":
        return {line.split(" (")[0].strip() for line in out.stdout.splitlines() if line.strip()}
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def _meshrun(packages: set[str]) -> set[str]:
    """The workspace's own crates among ``packages``."""
    return {p for p in packages if p == "meshrun" or p.startswith("meshrun-")}


ENGINE = ["meshrun-core", "meshrun-agent", "meshrun-machine", "meshrun-plan", "meshrun-protocol", "meshrun-channel", "meshrun-worker", "meshrun-data", "meshrun-ckpt", "meshrun-store", "meshrun-record"]


@pytest.mark.parametrize("crate", ENGINE)
def test_the_engine_crates_carry_no_web_rendering_or_binding_dependency(crate):
    packages = _packages(crate)
    assert crate in packages, f"cargo tree did not list {crate} itself: {sorted(packages)[:10]}"
    assert not packages & (WEB | RENDERING | BINDING), f"{crate} depends on {sorted(packages & (WEB | RENDERING | BINDING))}"


def test_the_web_stack_is_where_the_live_page_is():
    """The check above can fail: the live page's crate does pull the web
    stack and the renderer in."""
    packages = _packages("meshrun-serve")
    assert {"axum", "matchit", "meshrun-report"} <= packages, sorted(packages)
    assert not packages & BINDING, sorted(packages & BINDING)


def test_the_protocol_builds_without_the_engine_around_it():
    packages = _packages("meshrun-protocol")
    assert "meshrun-protocol" in packages, sorted(packages)
    assert _meshrun(packages) <= PROTOCOL_MESHRUN, f"meshrun-protocol depends on {sorted(_meshrun(packages) - PROTOCOL_MESHRUN)}"
    assert not packages & IO_PACKAGES, f"the protocol's messages build with {sorted(packages & IO_PACKAGES)}"


def test_the_connections_are_where_the_runtime_is():
    """The check above can fail: the channel, which carries the protocol's
    frames, does build with tokio and snow."""
    packages = _packages("meshrun-channel")
    assert {"tokio", "snow", "meshrun-protocol"} <= packages, sorted(packages)
    assert _meshrun(packages) <= CHANNEL_MESHRUN, sorted(_meshrun(packages) - CHANNEL_MESHRUN)


def test_the_worker_client_builds_without_the_engine():
    packages = _meshrun(_packages("meshrun-worker"))
    assert "meshrun-worker" in packages, sorted(packages)
    assert packages <= WORKER_MESHRUN, f"meshrun-worker depends on {sorted(packages - WORKER_MESHRUN)}"


def test_the_worker_client_names_no_async_runtime():
    """The client is threads over blocking sockets. tokio still comes in
    below it (the channel's async side for the controller and the agent,
    and the object-storage client under meshrun-ckpt), so only what the
    crate names itself is checked."""
    direct = _packages("meshrun-worker", depth=1)
    assert {"meshrun-worker", "meshrun-protocol", "meshrun-channel"} <= direct, sorted(direct)
    assert not direct & {"tokio", "meshrun-core"}, f"meshrun-worker names {sorted(direct & {'tokio', 'meshrun-core'})}"


def test_planning_is_below_the_machine_and_the_engine():
    packages = _meshrun(_packages("meshrun-plan"))
    assert "meshrun-plan" in packages, sorted(packages)
    assert packages <= PLAN_MESHRUN, f"meshrun-plan depends on {sorted(packages - PLAN_MESHRUN)}"


def test_the_plan_without_its_checks_does_no_io():
    """The plan's types, as the machine builds with them: the checks that
    read checkpoints and probe stores are the feature `validate`."""
    packages = _packages("meshrun-plan", features="none")
    assert _meshrun(packages) <= PROTOCOL_MESHRUN | {"meshrun-plan"}, sorted(_meshrun(packages))
    assert not packages & IO_PACKAGES, sorted(packages & IO_PACKAGES)


def test_the_machine_builds_without_io():
    """The no-I/O rule of the controller's state machine, kept by the build:
    no runtime, socket or store client below it, and the meshrun crates
    under it come without their I/O features."""
    packages = _packages("meshrun-machine")
    assert "meshrun-machine" in packages, sorted(packages)
    assert _meshrun(packages) <= MACHINE_MESHRUN, f"meshrun-machine depends on {sorted(_meshrun(packages) - MACHINE_MESHRUN)}"
    assert not packages & IO_PACKAGES, f"meshrun-machine builds with {sorted(packages & IO_PACKAGES)}"
    shown = _packages("meshrun-machine", features="show")
    io_features = {'meshrun-plan feature "validate"', 'meshrun-record feature "read"', 'meshrun-record feature "default"', 'meshrun-plan feature "default"'}
    assert not shown & io_features, f"meshrun-machine builds with {sorted(shown & io_features)}"


# What a source of the machine may not name: files, sockets, processes,
# threads, the environment, the clock (the driver passes the time in).
# Addresses (`std::net::SocketAddr`) are values, not I/O.
MACHINE_FORBIDDEN = re.compile(
    r"std::(fs|process|thread|env)\b|std::net::(TcpStream|TcpListener|UdpSocket)|\b(File|TcpStream|TcpListener|UdpSocket|Command)::|(Instant|SystemTime)::now|\btokio\b"
)


def _decisions(path) -> list[str]:
    """The lines of a machine source that decide: its tests (files
    ``tests*.rs``, a trailing ``#[cfg(test)] mod tests``) and the simulated
    driver, which reads the clock once for an origin, are left out; so are
    comments."""
    if path.name.startswith("tests") or path.name == "sim.rs":
        return []
    lines = path.read_text().split("\n#[cfg(test)]\nmod tests")[0].splitlines()
    return [line for line in lines if not line.lstrip().startswith("//")]


def test_the_machine_sources_name_no_io_or_clock():
    sources = sorted((ROOT / "crates" / "meshrun-machine" / "src").glob("*.rs"))
    decided = {p.name: _decisions(p) for p in sources}
    assert sum(map(len, decided.values())) > 2000, {k: len(v) for k, v in decided.items()}
    seen = [f"{name}: {line.strip()}" for name, lines in decided.items() for line in lines if MACHINE_FORBIDDEN.search(line)]
    assert not seen, "\n".join(seen)


def test_the_forbidden_names_are_caught():
    """The check above can fail: each kind of I/O it names is matched."""
    for line in ["use std::fs::File;", "let t = Instant::now();", "std::thread::spawn(f)", "tokio::spawn(x)", "Command::new(p)", "std::env::var(k)"]:
        assert MACHINE_FORBIDDEN.search(line), line
    assert not MACHINE_FORBIDDEN.search("let at = now + Duration::from_secs(1);")


def test_the_agent_builds_without_the_controller():
    packages = _meshrun(_packages("meshrun-agent"))
    assert "meshrun-agent" in packages, sorted(packages)
    assert packages <= AGENT_MESHRUN, f"meshrun-agent depends on {sorted(packages - AGENT_MESHRUN)}"


def test_the_engine_drives_the_machine_and_the_agent():
    packages = _meshrun(_packages("meshrun-core"))
    assert {"meshrun-core", "meshrun-machine", "meshrun-agent", "meshrun-plan", "meshrun-channel"} <= packages, sorted(packages)


def test_the_engine_is_seen_where_it_is():
    """The checks above can fail: the engine's own packages are more than
    the protocol's and the worker's, and it names tokio itself."""
    packages = _meshrun(_packages("meshrun-core"))
    assert {"meshrun-core", "meshrun-protocol"} <= packages, sorted(packages)
    assert not packages <= WORKER_MESHRUN, sorted(packages)
    assert "tokio" in _packages("meshrun-core", depth=1)
