"""Fast recovery: checkpoints in host memory with a replica on a buddy host,
and warm spares. Real workers killed with SIGKILL, real memory folders
wiped, real restarts; every run must end bit-identical to an uninterrupted
one."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import GPT, GPT_TINY, assert_none_left, freeze_agent_and_kill_worker, read_jsonl, start, stop, wait_for

pytestmark = pytest.mark.slow

EXAMPLE, TINY = GPT, GPT_TINY
TWO_HOSTS = ["--hosts", "2", "-n", "2", "--devices-per-proc", "2", "--tee", "none"]
STEPS = 30


def events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]


def spares_of(scratch: str) -> list[int]:
    """Spare interpreters still alive that were started for this test's
    hosts (their environment names the test's scratch folder)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"meshrun._spare" in (proc / "cmdline").read_bytes() and scratch.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def reference(gpt_reference) -> str:
    """The digest of the uninterrupted run on one host: the memory tier's
    restarts on two end with it, bit for bit."""
    return gpt_reference(*TINY, "--steps", str(STEPS)).digest


class Peak:
    """Samples each host's bytes in the memory tier (its own folder and the
    replica it keeps) while a run goes on."""

    def __init__(self, memory: Path):
        self.memory, self.peak, self.done = memory, {0: 0, 1: 0}, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    @staticmethod
    def size(path: Path) -> int:
        total = 0
        for root, _, files in os.walk(path):
            for f in files:
                try:
                    total += os.stat(os.path.join(root, f)).st_size
                except OSError:
                    pass
        return total

    def run(self) -> None:
        while not self.done.is_set():
            for run in self.memory.glob("*"):
                for h in (0, 1):
                    held = self.size(run / f"host-{h}") + self.size(run / f"replica-of-{1 - h}")
                    self.peak[h] = max(self.peak[h], held)
            time.sleep(0.005)

    def stop(self) -> dict[int, int]:
        self.done.set()
        self.thread.join()
        return self.peak


def run_killed(tmp_path: Path, name: str, data: list[str], extra: list[str], wipe) -> tuple[Path, str, dict[int, int]]:
    """Runs the GPT on 2 hosts with a memory checkpoint every step; once
    step 6 is committed in memory (with its replicas), SIGKILLs host 1's
    worker and wipes what ``wipe(run_memory)`` says, with host 1's agent
    stopped meanwhile (SIGSTOP) so that it commits nothing newer in
    between, and lets the restart finish."""
    runs = tmp_path / "runs"
    run_dir = runs / name
    memory = Path(os.environ["MESHRUN_MEMORY_DIR"])
    args = [*TWO_HOSTS, "--memory-checkpoint-every", "1", "--max-failures", "1", *extra, EXAMPLE, *TINY, "--steps", str(STEPS), *data, "--params-digest", str(tmp_path / f"{name}.sha")]
    peak = Peak(memory)
    proc = start(args, runs_dir=runs, name=name)
    try:
        wait_for(lambda: proc.poll() is not None or any(e["step"] >= 6 for e in events(run_dir, "memory_checkpoint_committed")), 240, "memory checkpoint of step 6")
        assert proc.poll() is None, proc.communicate()[1]
        pid = next(e["pid"] for e in events(run_dir, "worker_started") if e["attempt"] == 1 and e["rank"] == 1)
        agent = next(e["pid"] for e in events(run_dir, "agent_joined") if e["host"] == 1)
        (run_memory,) = memory.glob("*")
        try:
            freeze_agent_and_kill_worker(agent, pid)
            wipe(run_memory)
        finally:
            os.kill(agent, signal.SIGCONT)
        out, err = proc.communicate(timeout=600)
    finally:
        stop(proc)
        peaks = peak.stop()
    assert proc.returncode == 0, err
    assert_none_left(run_dir)
    return run_dir, (tmp_path / f"{name}.sha").read_text(), peaks


def test_a_host_that_lost_its_memory_restores_from_its_buddy_bit_identical(tmp_path, gpt_data, gpt_reference):
    data = ["--data-dir", gpt_data]
    want = reference(gpt_reference)

    def host_1_lost(run_memory: Path) -> None:
        # Everything host 1 kept: its own step and host 0's replica.
        shutil.rmtree(run_memory / "host-1")
        shutil.rmtree(run_memory / "replica-of-0", ignore_errors=True)

    # No durable checkpoint before the end: only memory can resume it.
    run_dir, got, peaks = run_killed(tmp_path, "buddy", data, ["--checkpoint-every", "1000"], host_1_lost)
    assert got == want, "final parameters differ from the uninterrupted run"
    committed = {e["step"]: e for e in events(run_dir, "memory_checkpoint_committed") if e["attempt"] == 1}
    assert all(e["replicated"] for e in committed.values())
    (resumed,) = events(run_dir, "resuming_from_memory")
    assert resumed["attempt"] == 2 and resumed["step"] >= 6
    assert resumed["sources"][0] == "this host's memory"
    # Host 1 restored host 0's replica of its step: fetched from host 0's
    # agent, or, since both loopback hosts live on this one machine, found
    # here (tests/test_hosts_apart.py has hosts that share nothing, where
    # it must cross the network).
    assert resumed["sources"][1].startswith(("the buddy's replica", "its replica on this machine")), resumed
    # At most one step lost: the restart resumes from the newest step
    # committed in memory before the kill, or the one after it.
    killed_at = next(e["time"] for e in events(run_dir, "worker_failed"))
    newest = max(s for s, e in committed.items() if e["time"] <= killed_at)
    assert resumed["step"] >= newest
    # Between saves a host holds its own step and its buddy's replica (2x);
    # while the next step is written it also holds that step's own copy and
    # its buddy's newer replica (the older copy and the older replica both
    # stay until the newer step is committed everywhere): 4x at the peak.
    shard = max(max(e["host_bytes"]) for e in committed.values())
    for h, p in peaks.items():
        print(f"host {h}: memory tier peak {p / 1e6:.2f} MB = {p / shard:.2f}x its shard bytes ({shard / 1e6:.2f} MB)")
        assert p <= 4 * shard + (64 << 10), f"host {h} held {p} bytes, over 4x its {shard} shard bytes"
    assert not spares_of(os.environ["MESHRUN_SCRATCH"]), "a warm spare outlived the run"


def test_with_both_copies_gone_the_run_resumes_from_storage_exactly(tmp_path, gpt_data, gpt_reference):
    data = ["--data-dir", gpt_data]
    want = reference(gpt_reference)

    def both_copies_of_host_1_lost(run_memory: Path) -> None:
        shutil.rmtree(run_memory / "host-1")
        shutil.rmtree(run_memory / "replica-of-1")

    run_dir, got, _ = run_killed(tmp_path, "both", data, ["--checkpoint-every", "4"], both_copies_of_host_1_lost)
    assert got == want, "final parameters differ from the uninterrupted run"
    assert not events(run_dir, "resuming_from_memory")
    (gone,) = events(run_dir, "memory_unavailable")
    assert "host 1" in gone["why"], gone
    (resuming,) = [e for e in events(run_dir, "resuming") if e["attempt"] == 2]
    assert resuming["step"] % 4 == 0 and gone["resume_step"] == resuming["step"]
    assert gone["step"] > resuming["step"], "memory held a newer step than storage"


def test_the_example_given_memory_checkpoints_alone_resumes_from_memory(tmp_path, gpt_data):
    """Without --checkpoint-every the GPT still passes its state, so a
    restart resumes from memory (storage gets no checkpoint: nothing was
    preempted) and no warning about an unused flag is given."""
    runs = tmp_path / "runs"
    run_dir = runs / "alone"
    args = [*TWO_HOSTS, "--memory-checkpoint-every", "1", "--max-failures", "1", EXAMPLE, *TINY, "--steps", str(STEPS), "--data-dir", gpt_data]
    proc = start(args, runs_dir=runs, name="alone")

    def reported() -> int:
        return max([m["step"] or 0 for m in read_jsonl(run_dir / "metrics.jsonl")], default=0)

    try:
        # Step 4 held in memory; a program that keeps none is killed at its
        # step 8 all the same, to show where it restarts.
        held = lambda: [e["step"] for e in events(run_dir, "memory_checkpoint_committed")]  # noqa: E731
        wait_for(lambda: proc.poll() is not None or max(held(), default=0) >= 4 or (not held() and reported() >= 8), 240, "memory checkpoint of step 4")
        assert proc.poll() is None, proc.communicate()[1]
        pid = next(e["pid"] for e in events(run_dir, "worker_started") if e["attempt"] == 1 and e["rank"] == 1)
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    resumed = events(run_dir, "resuming_from_memory")
    assert [e["attempt"] for e in resumed] == [2], (resumed, events(run_dir, "memory_unavailable"))
    first = min(m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if m["attempt"] == 2)
    assert resumed[0]["step"] >= 4 and first == resumed[0]["step"] + 1, (resumed, first)
    assert not events(run_dir, "checkpoint_committed"), "a durable checkpoint with memory checkpoints alone"
    assert "was given" not in (run_dir / "logs" / "rank-0.log").read_text()
    assert_none_left(run_dir)
