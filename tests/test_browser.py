"""`meshrun serve` in a real browser: headless Chromium (Debian's package,
driven by playwright) watches a live run. The run page's loss chart grows
and the run list turns to succeeded without the pages being reloaded, each
rank's step times show as a heatmap row, with
no script errors and nothing fetched from anywhere but the server."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from urllib.parse import urlsplit

import pytest

from conftest import MESHRUN, ROOT, SCRIPTS, assert_none_left, start, wait_for

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # reported by the test itself, with what to do
    sync_playwright = None

STEPS = 50  # at most 60, so that the chart also draws a circle per point
INTERVAL = 0.3  # seconds between reports: the run lasts about 15 s

# The number of points of the loss chart: one M or L command per point in
# the line's path (circles are drawn too, while there are at most 60).
COUNT_POINTS = """() => {
    const line = document.querySelector('#chart-loss path.series');
    if (!line) return {path: 0, circles: 0};
    return {
        path: (line.getAttribute('d').match(/[ML]/g) || []).length,
        circles: document.querySelectorAll('#chart-loss circle.point').length,
    };
}"""


def chromium() -> str:
    """Debian's chromium (playwright's own browser download is not used)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("no chromium on PATH (looked for 'chromium' and 'chromium-browser'): `make test` installs Debian's package, or run `apt-get install -y --no-install-recommends chromium` as root")
    return found


def stop_gently(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Ctrl-C (meshrun stops its workers on it), then SIGKILL if it is still
    there after `timeout` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.communicate(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_browser_watches_a_run_grow_and_finish_without_reloading(runs):
    if sync_playwright is None:
        pytest.fail("playwright is not installed in this environment: `make test` installs it from requirements.lock")
    browser_path = chromium()
    name = "live"
    run_dir = runs / name
    run = start(["-n", "2", "--platform", "cpu", "--tee", "none", "-q", str(SCRIPTS / "paced_loss.py"), str(STEPS), str(INTERVAL)], runs_dir=runs, name=name)
    server = None
    try:
        wait_for(lambda: (run_dir / "run.json").exists() or run.poll() is not None, 30, "the run to start")
        assert run.poll() is None, run.communicate()[1]
        server = subprocess.Popen([str(MESHRUN), "serve", "--runs-dir", str(runs), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        line = server.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert found, line + (server.communicate(timeout=10)[1] if server.poll() is not None else "")
        base = found.group(1)

        requests: list[str] = []
        bad_responses: list[str] = []
        errors: list[str] = []
        navigations: list[str] = []

        def watch(page):
            page.on("console", lambda m: errors.append(f"console error on {page.url}: {m.text} ({m.location['url']})") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error on {page.url}: {e}"))
            page.on("framenavigated", lambda f: navigations.append(f.url) if f == page.main_frame else None)
            return page

        with sync_playwright() as p:
            # Only loopback: no proxy, and no host name resolves.
            browser = p.chromium.launch(executable_path=browser_path, headless=True, args=["--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
            try:
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                context.set_default_timeout(15_000)
                context.on("request", lambda r: requests.append(r.url))
                context.on("response", lambda r: bad_responses.append(f"{r.status} {r.url}") if r.status >= 400 else None)

                # The run list shows the run as running, linked to its page.
                runs_page = watch(context.new_page())
                runs_page.goto(base)
                row = f'#runs tr[data-run="{name}"]'
                runs_page.wait_for_selector(f'{row}[data-state="running"]')
                assert runs_page.get_attribute(f"{row} a", "href") == f"/runs/{name}"
                runs_page.evaluate("window.__marker = 'runs'")

                # The run page: its loss chart grows in place.
                run_page = watch(context.new_page())
                run_page.goto(f"{base}runs/{name}")
                assert run_page.title() == f"meshrun report: {name}"
                run_page.evaluate("window.__marker = 'run'")
                run_page.wait_for_function(f"({COUNT_POINTS})().path >= 2")
                before = run_page.evaluate(COUNT_POINTS)
                assert before["circles"] == before["path"], before
                assert run.poll() is None, "the run ended before the page could watch it grow"
                run_page.wait_for_timeout(3_000)
                after = run_page.evaluate(COUNT_POINTS)
                assert after["path"] >= before["path"] + 3, f"the loss chart did not grow in 3 s: {before} -> {after}"
                assert after["circles"] == after["path"], after
                assert run_page.evaluate("window.__marker") == "run", "the run page was reloaded"
                assert run_page.locator(".badge.state-running").count() == 1
                # Per-rank step times: a heatmap row for each of the 2 ranks.
                run_page.wait_for_selector('#chart-lag g.row[data-rank="1"]')
                assert run_page.locator("#chart-lag g.row").count() == 2

                # The run ends; both pages follow without a reload.
                assert run.wait(timeout=60) == 0, run.communicate()[1]
                runs_page.wait_for_selector(f'{row}[data-state="succeeded"]')
                assert runs_page.evaluate("window.__marker") == "runs", "the run list was reloaded"
                run_page.wait_for_selector(".badge.state-succeeded")
                run_page.wait_for_function(f"({COUNT_POINTS})().path === {STEPS}")
                assert run_page.evaluate("window.__marker") == "run", "the run page was reloaded"

                assert navigations == [base, f"{base}runs/{name}"], f"pages navigated more than once: {navigations}"
                outside = [u for u in requests if urlsplit(u).hostname != "127.0.0.1"]
                assert not outside, f"fetched from elsewhere than the server: {outside}"
                assert not errors, "\n".join(errors)
                assert not bad_responses, bad_responses
                paths = {urlsplit(u).path for u in requests}
                assert paths == {"/", "/stream", f"/runs/{name}", f"/runs/{name}/stream"}, paths
            finally:
                browser.close()
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)
            try:
                _, err = server.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.communicate(timeout=10)
                err = "did not stop on SIGINT"
        stop_gently(run)
        assert_none_left(run_dir)
    assert server.returncode == 0, err
