"""A rank SIGKILLed mid-run: the run restarts from its newest checkpoint
and ends with the parameters of a run never interrupted, bit for bit."""

from __future__ import annotations

import os
import signal

from cellrun import PROGRAMS, read_jsonl, wait_for

RESUME = PROGRAMS / "resume.py"
STEPS, PAUSE = "16", "0.2"


def test_a_killed_rank_resumes_exactly(meshrun):
    common = ["-n", "2", "--checkpoint-every", "2", "--max-failures", "2"]
    ref = meshrun([*common, RESUME, STEPS, PAUSE], name="ref")
    assert ref.code == 0, ref.why()

    proc = meshrun.start([*common, RESUME, STEPS, PAUSE], name="killed")
    run_dir = meshrun.runs / "killed"

    def trained(step: int) -> bool:
        return proc.poll() is not None or any(r["attempt"] == 1 and r["step"] >= step for r in read_jsonl(run_dir / "metrics.jsonl"))

    wait_for(lambda: trained(5), 120, "attempt 1 to reach step 5")
    assert proc.poll() is None, "the run ended before it could be killed"
    pid = next(e["pid"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "worker_started" and e["attempt"] == 1 and e["rank"] == 1)
    os.kill(pid, signal.SIGKILL)
    done = meshrun.finish(proc)
    assert done.code == 0, done.why()

    failed = done.events("worker_failed")
    assert [(e["attempt"], e["rank"]) for e in failed] == [(1, 1)], failed
    assert len(done.events("restarting")) == 1
    final, want = done.json("final.json"), ref.json("final.json")
    assert final["attempt"] == 2 and final["first"] > 1, final  # resumed, not started over
    assert final["w"] == want["w"]
