"""Launch, jax.distributed and report with this venv's JAX, and meshrun's
hooks on JAX's private modules live in the workers: the CPU collectives on
the host's address and the compilation cache written by every rank."""

from __future__ import annotations

import importlib.util
import re
import socket
import sys
from pathlib import Path

import pytest
from cellrun import PROGRAMS

COLLECTIVE = PROGRAMS / "collective.py"
# Every hook that must be on in a worker, whatever the JAX.
WORKER_HOOKS = ("backends_are_initialized", "cache_from_every_process", "cluster_env", "gloo_on_host_address")


@pytest.fixture(scope="module")
def two_hosts(module_meshrun):
    """2 processes x 2 CPU devices on 2 hosts (each an agent on a loopback
    address of its own, 127.0.0.2 and up, which the machine's host name
    does not resolve to)."""
    done = module_meshrun(["-n", "2", "--hosts", "2", "--devices-per-proc", "2", COLLECTIVE], name="collective")
    assert done.code == 0, done.why()
    return done


@pytest.mark.short
def test_launch_and_a_collective_across_processes(two_hosts):
    for rank in (0, 1):
        rec = two_hosts.json(f"collective-{rank}.json")
        assert Path(rec["meshrun"]).resolve().is_relative_to(Path(sys.prefix).resolve()), rec["meshrun"]
        assert (rec["process_index"], rec["process_count"], rec["device_count"]) == (rank, 2, 4)
        # 2 x (1 + 1 + 2 + 2): each process's two devices hold its rank + 1.
        assert rec["total"] == 12.0
        assert rec["gathered"] == [0, 1]
    assert "total 12.0" in two_hosts.log(0)


@pytest.mark.short
def test_report_metrics_reach_the_run_and_its_report(two_hosts):
    records = [r for r in two_hosts.metrics() if r["metrics"].get("total") is not None]
    assert [(r["step"], r["metrics"]["total"]) for r in records] == [(1, 12.0)], two_hosts.metrics()
    # The run's report page (written at its end) shows them.
    page = (two_hosts.run_dir / "report.html").read_text()
    assert re.search(r"final step</dt><dd>1<", page) and re.search(r"last loss</dt><dd>1\.50*<", page), page[:3000]


@pytest.mark.short
@pytest.mark.parametrize("hook", WORKER_HOOKS)
def test_the_hook_on_private_jax_is_on_in_every_worker(two_hosts, hook):
    for rank in (0, 1):
        hooks = two_hosts.json(f"collective-{rank}.json")["hooks"]
        assert hooks.get(hook) == "on", hooks


@pytest.mark.short
def test_no_hook_is_off_and_none_warns(two_hosts):
    for rank in (0, 1):
        hooks = two_hosts.json(f"collective-{rank}.json")["hooks"]
        assert all(state == "on" for state in hooks.values()), hooks
    said = two_hosts.stderr + two_hosts.log(0) + two_hosts.log(1)
    assert "meshrun: warning: JAX" not in said


def test_backends_are_seen_starting(two_hosts):
    for rank in (0, 1):
        rec = two_hosts.json(f"collective-{rank}.json")
        assert (rec["backends_before"], rec["backends_after"]) == (False, True)


@pytest.mark.short
def test_gloo_listens_on_the_hosts_address_not_its_names(two_hosts):
    resolved = socket.gethostbyname(socket.gethostname())
    ips = []
    for rank in (0, 1):
        rec = two_hosts.json(f"collective-{rank}.json")
        ips.append(rec["host_ip"])
        # Gloo's listener, and on rank 0 the coordinator, which meshrun
        # binds to the run's address on host 0: all on the host's address.
        assert rec["listening"] and set(rec["listening"]) == {rec["host_ip"]}, rec
    # Without the hook gloo would listen where the host name resolves.
    assert resolved not in ips, (resolved, ips)


@pytest.mark.short
def test_every_rank_writes_its_compilation_and_hits_it_on_a_restart(meshrun):
    """JAX itself writes cache entries from process 0 only, and on CPU each
    process's key differs: meshrun's hook lets rank 1 write its own, so a
    second run's rank 1 loads its step instead of compiling it."""
    args = ["-n", "2", "--devices-per-proc", "2", COLLECTIVE]
    first = meshrun(args, name="cache")
    assert first.code == 0, first.why()
    cache = Path(meshrun.env["MESHRUN_SCRATCH"]) / "compile-cache"
    entries = sorted(p.name for p in cache.iterdir() if p.name.startswith("jit_compat_total-"))
    assert len(entries) == 2, entries
    again = meshrun(args, name="cache-again", env={"JAX_LOG_COMPILES": "1"})
    assert again.code == 0, again.why()
    assert "Persistent compilation cache hit for 'jit_compat_total'" in again.log(1), again.log(1)[-3000:]


@pytest.mark.short
def test_ray_is_not_installed():
    """The cells hold no Ray: everything above ran without it."""
    assert importlib.util.find_spec("ray") is None
