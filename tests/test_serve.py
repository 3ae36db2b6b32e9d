"""`meshrun serve`: the command line starts the live page on loopback,
serves the runs list and a run's page, and stops on Ctrl-C; on loopback it
answers only requests addressed to a loopback name, and on any other
address only those that carry the token it printed."""

from __future__ import annotations

import re
import signal
import subprocess
import urllib.error
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


def status_of(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, body) of a GET of ``url``, refusals included."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def serve(runs, *args: str) -> tuple[subprocess.Popen, re.Match]:
    """``meshrun serve`` on a free port, and the address line it printed."""
    proc = subprocess.Popen([str(MESHRUN), "serve", "--runs-dir", str(runs), "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    line = proc.stdout.readline()
    found = re.search(r"at http://([0-9.]+):(\d+)/(\?token=([0-9a-f]+))? ", line)
    if not found:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"no address printed: {line!r} {err}")
    return proc, found


def test_serve_on_loopback_refuses_requests_addressed_to_another_name(finished_run):
    proc, found = serve(finished_run)
    try:
        port = found.group(2)
        assert found.group(3) is None, "no token on loopback"
        assert status_of(f"http://127.0.0.1:{port}/runs/two", {"Host": f"localhost:{port}"})[0] == 200
        code, body = status_of(f"http://127.0.0.1:{port}/runs/two", {"Host": f"rebound.example:{port}"})
        assert code == 403 and f"addressed to 'rebound.example:{port}'" in body, (code, body)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)


def test_serve_on_another_address_needs_the_token_it_printed(finished_run):
    # Bound to every address; asked over loopback, with and without the token.
    proc, found = serve(finished_run, "--host", "0.0.0.0")
    try:
        port, token = found.group(2), found.group(4)
        assert token and len(token) == 64, found.group(0)
        code, body = status_of(f"http://127.0.0.1:{port}/")
        assert code == 403 and "needs its token" in body, (code, body)
        assert status_of(f"http://127.0.0.1:{port}/runs/two?token={'0' * 64}")[0] == 403
        code, listing = status_of(f"http://127.0.0.1:{port}/?token={token}")
        assert code == 200 and f'href="/runs/two?token={token}"' in listing, listing
        code, page = status_of(f"http://127.0.0.1:{port}/runs/two?token={token}")
        assert code == 200 and f"/runs/two/stream?token={token}" in page
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err


def test_serve_without_a_runs_directory_is_a_usage_error(tmp_path):
    done = cli("serve", "--runs-dir", tmp_path / "nothing", "--port", "0")
    assert done.returncode == 2
    assert f"no runs directory at '{tmp_path / 'nothing'}'" in done.stderr
