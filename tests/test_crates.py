"""Which crate depends on what: the engine's crates (supervision, the
control protocol, data loading, checkpoint I/O) carry no web server, no
renderer and no Python binding; those sit in crates of their own, and the
control protocol and the worker's client build without the controller and
the agent. Read from
``cargo tree`` over the lock file, so a dependency added to the wrong
crate fails here."""

from __future__ import annotations

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

# The meshrun crates the control protocol may build with, itself included:
# its messages carry meshrun-record's exit statuses and goodput timings and
# meshrun-ckpt's manifests and shard records, and meshrun-ckpt brings
# meshrun-store (where checkpoints are). Never the engine (meshrun-core),
# which speaks the protocol, nor the data loader.
PROTOCOL_MESHRUN = {"meshrun-protocol", "meshrun-record", "meshrun-ckpt", "meshrun-store"}

# The worker's client, inside every training process: the protocol's crates
# and itself, never the controller and the agent (meshrun-core).
WORKER_MESHRUN = PROTOCOL_MESHRUN | {"meshrun-worker"}


def _packages(crate: str, depth: int | None = None) -> set[str]:
    """The names of every package ``crate`` builds with (normal and build
    dependencies, not dev ones), itself included; with ``depth`` 1, only
    those it names itself."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.fail("cargo is not on PATH: the dependency check reads `cargo tree`")
    limit = [] if depth is None else ["--depth", str(depth)]
    out = subprocess.run(
        [cargo, "tree", "--offline", "--locked", "-p", crate, "-e", "normal,build", "--prefix", "none", "--format", "{p}", *limit],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def _meshrun(packages: set[str]) -> set[str]:
    """The workspace's own crates among ``packages``."""
    return {p for p in packages if p == "meshrun" or p.startswith("meshrun-")}


@pytest.mark.parametrize("crate", ["meshrun-core", "meshrun-protocol", "meshrun-worker", "meshrun-data", "meshrun-ckpt", "meshrun-store", "meshrun-record"])
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
    packages = _meshrun(_packages("meshrun-protocol"))
    assert "meshrun-protocol" in packages, sorted(packages)
    assert packages <= PROTOCOL_MESHRUN, f"meshrun-protocol depends on {sorted(packages - PROTOCOL_MESHRUN)}"


def test_the_worker_client_builds_without_the_engine():
    packages = _meshrun(_packages("meshrun-worker"))
    assert "meshrun-worker" in packages, sorted(packages)
    assert "meshrun-core" not in packages, "meshrun-worker depends on meshrun-core"
    assert packages <= WORKER_MESHRUN, f"meshrun-worker depends on {sorted(packages - WORKER_MESHRUN)}"


def test_the_worker_client_names_no_async_runtime():
    """The client is threads over blocking sockets. tokio still comes in
    below it (the protocol's async side for the controller and the agent,
    and the object-storage client under meshrun-ckpt), so only what the
    crate names itself is checked."""
    direct = _packages("meshrun-worker", depth=1)
    assert {"meshrun-worker", "meshrun-protocol"} <= direct, sorted(direct)
    assert not direct & {"tokio", "meshrun-core"}, f"meshrun-worker names {sorted(direct & {'tokio', 'meshrun-core'})}"


def test_the_engine_is_seen_where_it_is():
    """The checks above can fail: the engine's own packages are more than
    the protocol's and the worker's, and it names tokio itself."""
    packages = _meshrun(_packages("meshrun-core"))
    assert {"meshrun-core", "meshrun-protocol"} <= packages, sorted(packages)
    assert not packages <= WORKER_MESHRUN, sorted(packages)
    assert "tokio" in _packages("meshrun-core", depth=1)
