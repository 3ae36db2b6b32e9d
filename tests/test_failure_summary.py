"""What a failure summary says: who was stuck where, who had left early,
and only files that exist."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from conftest import SCRIPTS, meshrun

FINISH = str(SCRIPTS / "finish_early.py")


@pytest.mark.slow
def test_a_rank_stuck_after_the_last_report_is_a_hang_showing_its_own_frame(runs):
    # No --hang-timeout: the finish timeout alone catches it, long before
    # JAX's shutdown barrier would abort the finished rank (300 s).
    started = time.monotonic()
    done = meshrun(["-n", "2", "--finish-timeout", "3", FINISH], runs_dir=runs, env={"FINISH_MODE": "stuck"})
    took = time.monotonic() - started
    assert done.code == 1, done.stderr
    assert took < 60, f"took {took:.0f} s"
    assert "rank 1 hung: no report for 3 s (after step 5) while rank 0 had finished its program" in done.stderr
    frame = re.search(r"rank 1: (\S+):(\d+) in stuck_after_training", done.stderr)
    assert frame, done.stderr
    assert Path(frame.group(1)).name == "finish_early.py"
    stacks = re.search(r"stacks: (\S+)", done.stderr).group(1)
    assert Path(stacks).is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("recorder", ["on", "off"])
def test_a_rank_that_left_early_is_named_when_another_then_waits_for_it(runs, recorder):
    # With the flight recorder, at rank 1's finish (rank 0 is in a call
    # across processes rank 1 never made); without it, at the finish
    # timeout.
    env = {"FINISH_MODE": "leave", **({"MESHRUN_RECORDER": "0"} if recorder == "off" else {})}
    done = meshrun(["-n", "2", "--finish-timeout", "3", FINISH], runs_dir=runs, env=env)
    assert done.code == 1, done.stderr
    if recorder == "on":
        assert re.search(r"rank 0 waits in \S+ at finish_early\.py:\d+ \(its call \d+ across processes\) for rank 1, which finished its program", done.stderr), done.stderr
    else:
        assert "rank 0 hung" in done.stderr
    assert "rank 1 had already finished its program successfully (after step 3)" in done.stderr


def test_the_summary_names_no_stacks_folder_that_was_not_written(runs):
    done = meshrun(["-n", "2", str(SCRIPTS / "no_stacks.py")], runs_dir=runs)
    assert done.code == 1
    assert "rank 1 ended with exit code 3" in done.stderr
    assert "stacks:" not in done.stderr
    assert not (done.run_dir / "stacks").exists()


@pytest.mark.slow
def test_a_rank_that_ended_waits_for_nobody_so_the_others_may_take_their_time(runs):
    # The finish timeout is for a finished rank held waiting (JAX's
    # shutdown barrier): independent programs of uneven length are healthy.
    done = meshrun(["-n", "2", "--finish-timeout", "5", str(SCRIPTS / "uneven_independent.py")], runs_dir=runs, env={"MESHRUN_INDEPENDENT": "1"})
    assert done.code == 0, done.stderr
