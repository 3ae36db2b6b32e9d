"""`meshrun serve`: the command line starts the live page on loopback,
serves the runs list and a run's page, and stops on Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import urllib.request

from conftest import MESHRUN, ROOT, cli


def test_serve_lists_the_runs_and_serves_a_run_page_until_ctrl_c(finished_run):
    proc = subprocess.Popen([str(MESHRUN), "serve", "--runs-dir", str(finished_run), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert found, line + proc.stderr.read() if proc.poll() is not None else line
        base = found.group(1)
        with urllib.request.urlopen(base, timeout=10) as r:
            listing = r.read().decode()
        assert 'data-run="two"' in listing and 'data-state="succeeded"' in listing
        with urllib.request.urlopen(base + "runs/two", timeout=10) as r:
            page = r.read().decode()
        assert "meshrun report: two" in page and "new EventSource" in page
        assert "http://" not in page and "https://" not in page, "the page loads nothing from elsewhere"
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err


def test_serve_without_a_runs_directory_is_a_usage_error(tmp_path):
    done = cli("serve", "--runs-dir", tmp_path / "nothing", "--port", "0")
    assert done.returncode == 2
    assert f"no runs directory at '{tmp_path / 'nothing'}'" in done.stderr
