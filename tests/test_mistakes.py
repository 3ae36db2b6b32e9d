"""Multi-host mistakes named before they hang or corrupt (the flight
recorder, meshrun._recorder, and the controller's comparison of the ranks'
calls): each mistake of tests/scripts/mistakes.py ends its run at once with
a summary naming both ranks and what differs, where without the check it
hangs until the hang timeout (constant, reorder, skip) or ends with wrong
numbers (rows, seed); what legitimately differs per rank passes."""

from __future__ import annotations

import time

import pytest
from conftest import SCRIPTS, meshrun
from errors_page import covers, says

MISTAKES = str(SCRIPTS / "mistakes.py")
# Far beyond what a verdict takes: a hang that the check missed would end
# here, and fail the test's bound on the time.
HANG = "200"

# The row of docs/errors.md that says what each mistake's summary holds,
# and the shapes the rows leave out ("…"): whichever rank's call reached
# the controller second is the rank the summary names first.
CASES = {
    "constant": ("mistake-traced-program", []),
    "reorder": ("mistake-reordered-collectives", []),
    "skip": ("mistake-skipped-call", []),
    "rows": ("mistake-unequal-pieces", ["f32[8,4] on 2 devices, of f32[16,4]", "f32[6,4] on 2 devices, of f32[12,4]"]),
    "seed": ("mistake-replicas-differ", []),
}


@covers(*(row for row, _ in CASES.values()))
@pytest.mark.parametrize("mistake", sorted(CASES))
def test_a_mistake_across_processes_is_named_at_once_and_not_restarted(runs, mistake):
    started = time.monotonic()
    done = meshrun(["-n", "2", "--devices-per-proc", "2", "--hang-timeout", HANG, "--max-failures", "2", MISTAKES], runs_dir=runs, env={"MISTAKE": mistake})
    took = time.monotonic() - started
    assert done.code == 1, done.stderr
    assert took < 60, f"{took:.0f} s: the mistake was not named before the hang timeout"
    row, shapes = CASES[mistake]
    says(row, done.stderr)
    for words in shapes:
        assert words in done.stderr, done.stderr
    assert "(see docs/debugging.md)" in done.stderr
    # One attempt: a restart would run the same programs and part again.
    assert "attempt 2" not in done.stderr
    failed = [e for e in done.events() if e["event"] == "worker_failed"]
    assert len(failed) == 1, failed
    assert failed[0]["cause"]["kind"] == "programs_parted"
    assert {failed[0]["rank"], failed[0]["cause"]["other"]} == {0, 1}
    # The recorder's dump: each rank's last calls, and the programs.
    calls = (done.run_dir / "stacks" / "attempt-1" / "calls.txt").read_text()
    for rank in (0, 1):
        assert f"rank {rank}: " in calls and "make_array_from_process_local_data at mistakes.py:36" in calls, calls


def test_what_may_differ_per_rank_raises_no_alarm(runs):
    done = meshrun(["-n", "2", "--devices-per-proc", "2", MISTAKES], runs_dir=runs, env={"MISTAKE": "none"})
    assert done.code == 0, done.stderr
    assert "rank 0's own evaluation" in (done.run_dir / "logs" / "rank-0.log").read_text()
    programs = [e for e in done.events() if e["event"] == "program"]
    names = {p["name"] for p in programs}
    # The step and the global arrays' pieces were counted (the check ran);
    # rank 0's own evaluation and its mean were not.
    assert "jit_step" in names and "make_array_from_process_local_data" in names, names
    assert not any(p["name"] == "jit_mean" for p in programs), names


def test_a_mistake_is_named_on_two_hosts_of_one_machine(runs):
    done = meshrun(["--hosts", "2", "-n", "2", "--devices-per-proc", "2", "--hang-timeout", HANG, MISTAKES], runs_dir=runs, env={"MISTAKE": "rows"})
    assert done.code == 1, done.stderr
    assert "make_array_from_process_local_data with other arguments" in done.stderr
