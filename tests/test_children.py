"""Nothing a worker starts outlives it: when a worker ends (its program
returned, failed, or was stopped), meshrun ends the processes it left, even
those in a process group or a session of their own, and records it in
events.jsonl."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import SCRIPTS, alive, meshrun, read_jsonl, wait_for

SCRIPT = str(SCRIPTS / "leave_children.py")


def cgroup_base() -> Path | None:
    """This process's cgroup v2 directory (meshrun makes its workers'
    cgroups in the cgroup of the process that spawns them, which is ours)."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        own = next(l[3:] for l in Path("/proc/self/cgroup").read_text().splitlines() if l.startswith("0::"))
    except (OSError, StopIteration):
        return None
    for line in mounts:
        mount, _, fs = line.partition(" - ")
        if fs.split()[0] == "cgroup2":
            root, point = mount.split()[3:5]
            rel = own[len(root):] if root != "/" and own.startswith(root) else own
            return Path(point) / rel.lstrip("/")
    return None


def cgroups_usable() -> bool:
    base = cgroup_base()
    if base is None:
        return False
    probe = base / f"meshrun-test-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return os.access(base / "cgroup.procs", os.W_OK)


CGROUPS = cgroups_usable()


def children(run_dir: Path, ranks) -> dict[int, list[int]]:
    out = {}
    for r in ranks:
        path = run_dir / f"children-{r}"
        if path.exists():
            out[r] = [int(p) for p in path.read_text().split()]
    return out


def kill_all(kids: dict[int, list[int]]) -> None:
    for pids in kids.values():
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def ended_events(run_dir: Path) -> dict[int, dict]:
    return {e["rank"]: e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "leftovers_ended"}


def assert_all_ended(run_dir: Path, ranks, how: str, stopped=()) -> None:
    kids = children(run_dir, ranks)
    assert sorted(kids) == list(ranks), f"not every rank wrote its children: {sorted(kids)}"
    everyone = [p for pids in kids.values() for p in pids]
    wait_for(lambda: not any(alive(p) for p in everyone), 3, f"every child to be ended: {kids}")
    events = ended_events(run_dir)
    for r in ranks:
        e = events.get(r)
        assert e is not None, f"no leftovers_ended event for rank {r}: {events}"
        assert e["how"] == how
        assert e["count"] == len(e["pids"])
        if r in stopped:
            # The stop's SIGTERM to the worker's group may end the child in
            # the group first; the two that left it are the leftovers.
            assert set(kids[r][1:]) <= set(e["pids"]) <= set(kids[r]), (e, kids[r])
        else:
            assert sorted(e["pids"]) == sorted(kids[r]), (e, kids[r])


def assert_no_cgroup_left(run_dir: Path) -> None:
    if not CGROUPS:
        return
    agents = {e["pid"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "agent_joined"}
    left = [d.name for d in cgroup_base().iterdir() if any(d.name.startswith(f"meshrun-{p}-") for p in agents)]
    assert not left, f"cgroups left behind: {left}"


def expected_how(hosts: int) -> str:
    if CGROUPS:
        return "cgroup"
    return "process group and subreaper" if hosts > 1 else "process group"


def test_children_of_a_finished_worker_are_ended(runs):
    run_dir = runs / "t"
    try:
        done = meshrun(["-n", "2", SCRIPT], runs_dir=runs)
        assert done.code == 0, done.stderr
        if not CGROUPS:
            pytest.skip("no cgroup can be made here: one host ends only the worker's process group")
        assert_all_ended(run_dir, [0, 1], "cgroup")
        assert_no_cgroup_left(run_dir)
    finally:
        kill_all(children(run_dir, [0, 1]))


def test_children_are_ended_when_a_failure_stops_the_group(runs):
    run_dir = runs / "t"
    try:
        done = meshrun(["-n", "2", SCRIPT], runs_dir=runs, env={"FAIL_RANK": "1"})
        assert done.code == 1, done.stderr
        assert "rank 1" in done.stderr
        if not CGROUPS:
            pytest.skip("no cgroup can be made here: one host ends only the worker's process group")
        # Rank 1's failure stops the group, its own process group included
        # when its exit is reported before the worker is gone.
        assert_all_ended(run_dir, [0, 1], "cgroup", stopped=[0, 1])
        assert_no_cgroup_left(run_dir)
    finally:
        kill_all(children(run_dir, [0, 1]))


@pytest.mark.slow
@pytest.mark.parametrize("cgroup", ["on", "off"])
def test_separate_agents_end_children(runs, cgroup):
    # With cgroups off, the agent process is the subreaper of its workers'
    # descendants: the children that left the group come back to it.
    run_dir = runs / "t"
    env = {"MESHRUN_CGROUP": "0"} if cgroup == "off" else {}
    how = expected_how(2) if cgroup == "on" else "process group and subreaper"
    try:
        done = meshrun(["-n", "2", "--hosts", "2", SCRIPT], runs_dir=runs, env=env)
        assert done.code == 0, done.stderr
        assert_all_ended(run_dir, [0, 1], how)
        assert_no_cgroup_left(run_dir)
    finally:
        kill_all(children(run_dir, [0, 1]))


@pytest.mark.slow
def test_without_cgroups_one_host_ends_the_process_group(runs):
    # The agent lives in the controller's process, which must not become a
    # subreaper: only the child that stayed in the worker's group is found.
    run_dir = runs / "t"
    try:
        done = meshrun(["-n", "1", SCRIPT], runs_dir=runs, env={"MESHRUN_CGROUP": "0"})
        assert done.code == 0, done.stderr
        [in_group, own_group, own_session] = children(run_dir, [0])[0]
        wait_for(lambda: not alive(in_group), 3, "the child in the worker's group to be ended")
        e = ended_events(run_dir)[0]
        assert (e["how"], e["pids"]) == ("process group", [in_group])
        assert alive(own_group) and alive(own_session)
    finally:
        kill_all(children(run_dir, [0]))


@pytest.mark.skipif(not CGROUPS, reason="no cgroup can be made here")
def test_a_cgroup_left_by_a_dead_agent_is_cleared(runs):
    # A cgroup named after a process that no longer exists, with a process
    # still in it: the next run ends that process and removes the cgroup.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = cgroup_base() / f"meshrun-{dead.pid}-0-rank0"
    stale.mkdir()
    left = subprocess.Popen(["sleep", "300"])
    try:
        (stale / "cgroup.procs").write_text(str(left.pid))
        done = meshrun(["-n", "1", str(SCRIPTS / "hello.py")], runs_dir=runs)
        assert done.code == 0, done.stderr
        assert left.wait(timeout=3) == -signal.SIGKILL
        assert not stale.exists()
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()
        if stale.exists():
            stale.rmdir()
