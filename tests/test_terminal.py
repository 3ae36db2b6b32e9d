"""What the terminal does must never reach the run: a reader that does not
read, a stream closed by its reader, lines longer than a frame."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from conftest import MESHRUN, ROOT, SCRIPTS, assert_none_left, meshrun, stop, wait_for

NUMBERED = re.compile(r"^\d{8} x+$")


@pytest.mark.slow
def test_a_reader_that_does_not_read_neither_stops_the_run_nor_delays_the_logs(runs):
    # Rank 0 prints about 500 KB/s for 12 s while nobody reads meshrun's
    # stdout: longer than the 10 s after which a worker whose heartbeats are
    # not read counts as frozen, and more than the terminal queue holds.
    proc = subprocess.Popen(
        [str(MESHRUN), "run", "--runs-dir", str(runs), "--name", "chatty", "-n", "2", str(SCRIPTS / "chatty.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CHATTY_SECONDS": "12", "CHATTY_RATE": "500000"},
        cwd=ROOT,
    )
    log = runs / "chatty" / "logs" / "rank-0.log"
    numbered = lambda: sum(1 for line in log.read_text().splitlines() if NUMBERED.match(line)) if log.exists() else 0  # noqa: E731
    try:
        # From the first line on (a loaded machine may take long to start
        # the worker), the log is written as the lines come, whatever the
        # terminal does.
        wait_for(lambda: numbered() > 0, 90, "rank 0's first line")
        time.sleep(5)
        assert numbered() > 10_000
        # Still nobody reads until the rank is done printing: the terminal's
        # queue must overflow, and the run must not wait for it.
        wait_for(lambda: "printed" in log.read_text(), 90, "rank 0 to finish printing")
        out, err = proc.communicate(timeout=90)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    text = log.read_text()
    printed = int(re.search(r"printed (\d+) lines", text).group(1))
    assert sum(1 for line in text.splitlines() if NUMBERED.match(line)) == printed
    # The terminal got the lines in order, with gaps where it was behind.
    shown = [int(line[:8]) for line in out.splitlines() if NUMBERED.match(line)]
    assert shown[:100] == list(range(100))
    assert all(a < b for a, b in zip(shown, shown[1:]))
    dropped = sum(int(n) for n in re.findall(r"meshrun: (\d+) lines? of output not shown", err))
    assert dropped > 0, "the queue should have overflowed in this test"
    # rank 0's lines: the numbered ones and the count at the end
    assert len(out.splitlines()) + dropped == printed + 1
    assert_none_left(runs / "chatty")


@pytest.mark.slow
def test_a_closed_stderr_does_not_stop_the_run(runs):
    # The reader of stderr is gone before meshrun writes its restart note.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [str(MESHRUN), "run", "--runs-dir", str(runs), "--name", "closed", "-n", "2", "--max-failures", "1", str(SCRIPTS / "fail_first_attempt.py")],
            stdout=subprocess.DEVNULL,
            stderr=write_end,
            timeout=120,
            cwd=ROOT,
        )
    finally:
        os.close(write_end)
    run = json.loads((runs / "closed" / "run.json").read_text())
    assert proc.returncode == 0
    assert run["state"] == "succeeded"
    assert [a["state"] for a in run["attempts"]] == ["failed", "succeeded"]
    assert_none_left(runs / "closed")


def test_a_long_line_stays_whole_in_the_log(runs):
    size = 300_000
    done = meshrun(["-n", "1", str(SCRIPTS / "long_line.py")], runs_dir=runs, env={"LONG_LINE_BYTES": str(size)})
    assert done.code == 0, done.stderr
    expected = "".join("\u00e9" if i % 1000 == 999 else "a" for i in range(size))
    lines = done.log(0).splitlines()
    assert expected in lines
    assert lines[lines.index(expected) + 1] == "after the long line"
    # The terminal shows the line's start and says where the rest is.
    shown = [line for line in done.stdout.splitlines() if line.startswith("aaa")]
    assert len(shown) == 1 and shown[0].endswith("more bytes in the rank log]")
    assert expected.startswith(shown[0].split("... [")[0])
