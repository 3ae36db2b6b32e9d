"""The live page of a run still going, as Chromium lays it out: it is at
a step (not a final one), the attempt labels of its charts are whole,
inside their chart and clear of each other, the heatmap's labels are the
size of the charts' text (not blown up to the page's width), a failure
whose cause names its host says the host once, and `meshrun status` says
whose wall time its goodput covers.

The run is written by the test (a real run cannot be made to restart
twice within seconds, near the end of its steps, on cue), and held open
with the run's lock as its controller would hold it."""

from __future__ import annotations

import fcntl
import html
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import MESHRUN, ROOT

sys.path.insert(0, str(ROOT / "bench"))
import screenshot  # noqa: E402  (bench/screenshot.py)

NAME = "live"
WIDTH = 1280
UNREACHABLE = "rank 3 is on host 1 (10.77.0.2), unreachable for 10 s"


def jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def write_live_run(run_dir: Path, now: float) -> None:
    """A run 101 s old on 2 hosts of 2 ranks: attempt 1 lost host 1 at 30 s,
    attempt 2 failed 3 s after it began, attempt 3 began a second later and
    runs, resumed from step 110 of the 112 steps so far."""
    t0 = now - 101.0
    run_dir.mkdir(parents=True)
    cause = {"kind": "host_unreachable", "host": 1, "ip": "10.77.0.2", "secs": 10.0}
    boom = {"kind": "exception", "exception": "OSError", "message": "disk gone", "traceback": ""}
    attempts = [(1, 0.0, 30.0, "failed", 3, 1, cause), (2, 31.0, 34.0, "failed", 0, 0, boom), (3, 35.0, None, "running", None, None, None)]
    record = {
        "name": NAME, "run_id": "l1", "state": "running", "created": rfc3339(t0),
        "plan": {"nprocs": 4, "hosts": 2, "procs_per_host": 2, "platform": "cpu"},
        "versions": {"meshrun": "0.1.0", "protocol": 1},
        "attempts": [
            {"attempt": n, "state": state, "started": rfc3339(t0 + a), **({"ended": rfc3339(t0 + b)} if b else {}),
             **({"failure": {"rank": rank, "host": host, "attempt": n, "cause": c, "exit": None}} if c else {})}
            for n, a, b, state, rank, host, c in attempts
        ],
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    events = []
    for n, a, b, state, rank, host, c in attempts:
        events.append({"event": "attempt_started", "time": t0 + a, "attempt": n, "nprocs": 4, "hosts": 2, "control_addr": "10.77.0.1:9000"})
        if c:
            events.append({"event": "worker_failed", "time": t0 + b - 0.1, "rank": rank, "host": host, "attempt": n, "cause": c, "exit": None})
            events.append({"event": "attempt_ended", "time": t0 + b, "attempt": n, "state": state})
            events.append({"event": "restarting", "time": t0 + b, "after_attempt": n, "failures": n, "max_failures": 3, "from_step": 110})
    events.append({"event": "checkpoint_committed", "time": t0 + 25.0, "attempt": 1, "step": 110, "path": "/c/step-110"})
    jsonl(run_dir / "events.jsonl", events)
    metrics = [{"time": t0 + 2.0 + 0.2 * s, "attempt": 1, "step": s, "metrics": {"loss": 5.0 / s, "tokens_per_s": 4000.0}} for s in range(1, 112)]
    metrics += [{"time": t0 + 38.0 + 30.0 * i, "attempt": 3, "step": s, "metrics": {"loss": 5.0 / s, "tokens_per_s": 4100.0}} for i, s in enumerate((111, 112))]
    jsonl(run_dir / "metrics.jsonl", metrics)
    jsonl(run_dir / "lag.jsonl", [{"time": t0 + 2.0 + 0.2 * s, "attempt": 1, "step": s, "step_ms": 200.0, "lag_ms": [0.0, 1.0, 2.0, 40.0]} for s in range(1, 112)])
    parts = {"startup": 2.0, "compile": 3.0, "restore": 0.0, "data": 0.5, "step": 20.0, "checkpoint": 0.5, "lost": 4.0, "resize": 0.0, "other": 0.0}
    done = [{"attempt": 1, "state": "failed", "start": t0, "end": t0 + 30.0, "wall_s": 30.0, "seconds": parts},
            {"attempt": 2, "state": "failed", "start": t0 + 30.0, "end": t0 + 34.0, "wall_s": 4.0, "seconds": {**parts, "step": 0.0, "lost": 4.0, "startup": 0.0, "compile": 0.0, "data": 0.0, "checkpoint": 0.0}}]
    goodput = {"wall_s": 34.0, "measured_s": 34.0, "goodput": 20.0 / 34.0, "attempts": done,
               "seconds": {**parts, "lost": 8.0}, "fractions": {k: v / 34.0 for k, v in {**parts, "lost": 8.0}.items()}}
    (run_dir / "goodput.json").write_text(json.dumps(goodput))


# Added to a copy of the served page (the page itself runs only its
# stream's script): what Chromium laid out, as JSON in the DOM.
PROBE = """<script>
const size = el => {
  const svg = el.ownerSVGElement;
  return parseFloat(getComputedStyle(el).fontSize) * svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
};
const charts = {};
for (const svg of document.querySelectorAll("svg.chart")) {
  charts[svg.id] = {width: svg.viewBox.baseVal.width, markers: [...svg.querySelectorAll("g.marker")].map(g => {
    const text = g.querySelector("text"), title = g.querySelector("title").textContent;
    if (!text) return {title};
    const b = text.getBBox();
    return {title, text: text.textContent, box: [b.x, b.y, b.x + b.width, b.y + b.height]};
  })};
}
const pre = document.createElement("pre");
pre.id = "layout";
pre.textContent = JSON.stringify({
  labels: [...document.querySelectorAll("header dl.summary dt")].map(e => e.textContent),
  cut: [...document.querySelectorAll("header dl.summary dd")].filter(e => e.scrollWidth > e.clientWidth).map(e => e.textContent),
  charts,
  body: parseFloat(getComputedStyle(document.body).fontSize),
  heatmap: [...document.querySelectorAll("#chart-lag g.row text")].map(size),
  ticks: [...document.querySelectorAll("svg.chart g.axis text:not(.axis-title)")].map(size),
  failures: [...document.querySelectorAll("td.failure-cell")].map(td => td.firstChild ? td.firstChild.textContent : ""),
});
document.body.appendChild(pre);
</script>"""


@pytest.fixture
def live_run(tmp_path):
    """The run folder, held open as its controller holds it."""
    runs = tmp_path / "runs"
    write_live_run(runs / NAME, time.time())
    with open(runs / NAME / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield runs


def served_page(runs: Path) -> str:
    """The run's page as `meshrun serve` serves it."""
    proc = subprocess.Popen([str(MESHRUN), "serve", "--runs-dir", str(runs), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert found, line
        with urllib.request.urlopen(f"{found.group(1)}runs/{NAME}", timeout=10) as r:
            return r.read().decode()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_the_live_page_of_a_restarted_run_lays_out_in_chromium(live_run, tmp_path):
    try:
        screenshot.find_chromium()
    except screenshot.ChromiumMissing as e:
        pytest.fail(f"{e} (`make test` installs Debian's chromium)")
    page = tmp_path / "page.html"
    page.write_text(served_page(live_run).replace("</body>", PROBE + "</body>"))
    dom = screenshot.dump_dom(page, width=WIDTH, height=1000)
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    layout = json.loads(html.unescape(found.group(1)))

    assert "step" in layout["labels"] and "final step" not in layout["labels"], layout["labels"]
    assert layout["cut"] == [], f"header values wider than their box: {layout['cut']}"

    labelled = 0
    for chart, drawn in layout["charts"].items():
        markers = drawn["markers"]
        for i, m in enumerate(markers):
            assert m.get("text") == m["title"], f"{chart}: a label not drawn whole: {m}"
            x0, _, x1, _ = m["box"]
            assert 0 <= x0 and x1 <= drawn["width"], f"{chart}: {m['text']!r} leaves the chart: {m['box']}"
            for other in markers[i + 1 :]:
                assert not overlap(m["box"], other["box"]), f"{chart}: {m['text']!r} {m['box']} is drawn over {other['text']!r} {other['box']}"
            labelled += 1
    assert labelled >= 6, layout["charts"]  # 2 restarts in the loss, steps/s and tokens/s charts

    # About the size of the charts' own labels, smaller than the page's
    # text (the charts beside each other are shrunk a little to fit).
    heatmap, ticks = layout["heatmap"], layout["ticks"]
    assert heatmap and ticks
    assert max(heatmap) < layout["body"], (heatmap, layout["body"])
    assert max(heatmap) <= 1.25 * min(ticks), (heatmap, ticks)

    assert layout["failures"][0] == UNREACHABLE, layout["failures"]


def test_status_says_whose_wall_time_the_goodput_is(live_run):
    done = subprocess.run([str(MESHRUN), "status", NAME, "--runs-dir", str(live_run)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    duration = re.search(r"^duration  (\S+)$", done.stdout, re.M).group(1)
    assert re.fullmatch(r"1m4\ds", duration), done.stdout
    assert f"\ngoodput   over attempts 1-2: 34.0s wall time, of the run's {duration} so far; attempt 3 is counted when it ends\n" in done.stdout, done.stdout
