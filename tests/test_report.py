"""The report page of a real run that failed once and resumed: written by
`meshrun report`, self-contained, and rendered by headless Chromium into a
DOM whose charts have axes and curves and a screenshot that is not blank."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from conftest import MESHRUN, ROOT, SCRIPTS, meshrun, read_jsonl

sys.path.insert(0, str(ROOT / "bench"))
import screenshot  # noqa: E402  (bench/screenshot.py)

# Every test reads one run that fails and resumes, and one renders it in
# Chromium.
pytestmark = pytest.mark.slow

NAME = "report"
WIDTH = 1280


# --- fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> str:
    """The Chromium binary, installed with apt-get when missing (Debian)."""
    try:
        return screenshot.find_chromium()
    except screenshot.ChromiumMissing:
        pass
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("chromium is not installed, and installing it needs root and apt-get: `apt-get install chromium`")
    proc = subprocess.run(
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium",
        shell=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"apt-get install chromium failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return screenshot.find_chromium()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    """fail_once.py on 2 processes: rank 1 raises at step 12 of attempt 1,
    attempt 2 resumes from the checkpoint of step 10 and finishes step 30."""
    runs = tmp_path_factory.mktemp("report") / "runs"
    done = meshrun(["-n", "2", "--max-failures", "1", "--checkpoint-every", "5", "--tee", "none", str(SCRIPTS / "fail_once.py")], runs_dir=runs, name=NAME, timeout=120)
    assert done.code == 0, done.stderr + done.log(1)[-3000:]
    assert (done.run_dir / "report.html").exists(), "every run writes its report page at its end"
    return done


@pytest.fixture(scope="module")
def page(run) -> Path:
    proc = subprocess.run([str(MESHRUN), "report", NAME, "--runs-dir", str(run.run_dir.parent)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    path = run.run_dir / "report.html"
    assert proc.stdout.strip() == str(path), proc.stdout
    assert path.is_file()
    return path


# --- a small DOM ----------------------------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Node:
    def __init__(self, tag: str, attrs: dict[str, str]):
        self.tag, self.attrs, self.children = tag, attrs, []

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None, id: str | None = None) -> list[Node]:
        return [
            n
            for n in self.iter()
            if (tag is None or n.tag == tag)
            and (cls is None or set(cls.split()) <= set(n.attrs.get("class", "").split()))
            and (id is None or n.attrs.get("id") == id)
        ]

    def find(self, **kw) -> Node:
        found = self.find_all(**kw)
        assert found, f"no element {kw}"
        return found[0]

    def text(self) -> str:
        return "".join(c.text() if isinstance(c, Node) else c for c in self.children)


class TreeBuilder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(html: str) -> Node:
    builder = TreeBuilder()
    builder.feed(html)
    return builder.root


# --- PNG -------------------------------------------------------------------------


def read_png(path: Path) -> np.ndarray:
    """An 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes) as an
    (height, width, 3) array."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, f"unsupported PNG: depth {depth}, colour type {color}, interlace {interlace}"
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.uint8)
    for y in range(height):
        kind, row = raw[y, 0], raw[y, 1:]
        if kind == 0:
            cur = row.copy()
        elif kind == 1:  # Sub: a running sum along the row, per channel
            cur = np.cumsum(row.reshape(-1, bpp), axis=0, dtype=np.uint8).reshape(-1)
        elif kind == 2:  # Up
            cur = row + prev
        else:  # Average, Paeth: each byte depends on the one decoded before it
            r, p, c = row.tolist(), prev.tolist(), [0] * stride
            for i in range(stride):
                a = c[i - bpp] if i >= bpp else 0
                b = p[i]
                if kind == 3:
                    c[i] = (r[i] + ((a + b) >> 1)) & 255
                else:
                    d = p[i - bpp] if i >= bpp else 0
                    pa, pb, pc = abs(b - d), abs(a - d), abs(a + b - 2 * d)
                    c[i] = (r[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else d)) & 255
            cur = np.array(c, np.uint8)
        out[y] = prev = cur
    return out.reshape(height, width, bpp)[:, :, :3]


# A script added to a copy of the page (never to the report itself, which
# has none): writes where each picture was laid out into the DOM.
LAYOUT_PROBE = """<script>
const boxes = {};
for (const el of document.querySelectorAll("svg.chart, svg#goodput, svg#timeline")) {
  const r = el.getBoundingClientRect();
  boxes[el.id] = [r.left + scrollX, r.top + scrollY, r.width, r.height];
}
const pre = document.createElement("pre");
pre.id = "layout";
pre.textContent = JSON.stringify({boxes, height: document.documentElement.scrollHeight});
document.body.appendChild(pre);
</script>"""


# --- tests -----------------------------------------------------------------------


def test_the_run_failed_once_and_resumed(run) -> None:
    events = run.events()
    restart = next(e for e in events if e["event"] == "restarting")
    assert restart["from_step"] == 10, restart
    failed = next(e for e in events if e["event"] == "worker_failed")
    assert failed["rank"] == 1 and "injected failure at step 12" in failed["cause"]["message"]
    steps = [(m["attempt"], m["step"]) for m in run.metrics()]
    assert (2, 11) in steps and (2, 30) in steps and max(s for a, s in steps if a == 1) < 12, steps


def test_the_page_is_self_contained(page: Path) -> None:
    html = page.read_text()
    assert "http://" not in html and "https://" not in html
    assert "<script" not in html and "<link" not in html and "src=" not in html
    assert html.count('<svg class="chart"') >= 3
    assert len(html) < 1_000_000


def test_a_missing_run_is_a_usage_error(run) -> None:
    runs = run.run_dir.parent
    proc = subprocess.run([str(MESHRUN), "report", "no-such-run", "--runs-dir", str(runs)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert f"no run named 'no-such-run' in {runs}" in proc.stderr, proc.stderr
    assert not (runs / "no-such-run").exists()


@pytest.mark.timeout(900)  # the first use may install Chromium
def test_chromium_renders_charts_timeline_and_goodput(chromium: str, page: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    dom = parse(screenshot.dump_dom(probe, width=WIDTH, height=1000))

    for chart_id in ("chart-loss", "chart-val", "chart-throughput"):
        chart = dom.find(tag="svg", id=chart_id)
        assert "chart" in chart.attrs["class"].split()
        series = chart.find_all(cls="series")
        assert series, f"{chart_id} has no series"
        for s in series:
            assert (s.attrs.get("d") or s.attrs.get("points", "")).strip(), f"{chart_id}: empty series {s.attrs}"
        for axis in ("x", "y"):
            g = chart.find(tag="g", cls=f"axis {axis}")
            lines = g.find_all(tag="line")
            assert lines and all(line.attrs.get("stroke") for line in lines[:1]), f"{chart_id} {axis} axis has no line"
            labels = [t.text().strip() for t in g.find_all(tag="text")]
            numeric = [t for t in labels if t.replace(".", "", 1).replace("-", "", 1).rstrip("kMG").isdigit()]
            assert len(numeric) >= 2, f"{chart_id} {axis} axis tick labels: {labels}"
    loss = dom.find(tag="svg", id="chart-loss").find(cls="series")
    assert loss.attrs["d"].count("M") == 2, "attempt 2 redoes steps 11-12 as its own stroke"

    timeline = dom.find(tag="svg", id="timeline")
    failures = [f.text() for f in timeline.find_all(cls="failure")]
    assert any("attempt 1 failed: rank 1 raised ValueError: injected failure at step 12" in t for t in failures), failures
    assert timeline.find_all(cls="checkpoint"), "no checkpoint markers"
    assert {"state-failed", "state-succeeded"} <= {c for g in timeline.find_all(cls="attempt") for c in g.attrs["class"].split()}
    goodput = dom.find(id="goodput-section")
    if (page.parent / "goodput.json").exists():
        assert goodput.find_all(tag="svg", id="goodput")
    else:
        assert "no goodput data" in goodput.text()

    layout = json.loads(dom.find(id="layout").text())
    boxes = layout["boxes"]
    height = min(int(layout["height"]) + 10, 6000)
    png = screenshot.screenshot(page, tmp_path / "report.png", WIDTH, height)
    image = read_png(png)
    assert image.shape[1] == WIDTH and image.shape[0] >= min(height, 2000), image.shape
    for name in ("chart-loss", "chart-val", "chart-throughput", "timeline"):
        x, y, w, h = (int(round(v)) for v in boxes[name])
        assert w > 200 and h > 60 and y + h <= image.shape[0], (name, boxes[name], image.shape)
        crop = image[y : y + h, x : x + w].reshape(-1, 3)
        ink = np.any(crop < 235, axis=1).mean()
        colours = len(np.unique(crop, axis=0))
        assert ink > 0.01 and colours >= 8, f"{name} looks blank: {ink:.3%} of pixels drawn, {colours} colours"
    # The curves are drawn in colour, not only the grey axes.
    loss_box = [int(round(v)) for v in boxes["chart-loss"]]
    crop = image[loss_box[1] : loss_box[1] + loss_box[3], loss_box[0] : loss_box[0] + loss_box[2]].astype(int)
    blue = (crop[:, :, 2] - crop[:, :, 0] > 80).sum()
    assert blue > 200, f"the loss curve is missing ({blue} blue pixels)"


def test_the_report_reads_what_the_run_wrote(run, page: Path) -> None:
    """The header agrees with run.json and metrics.jsonl."""
    dom = parse(page.read_text())
    record = json.loads((run.run_dir / "run.json").read_text())
    assert dom.find(cls="run-name").text() == NAME
    assert dom.find(cls="attempts").find(tag="dd").text() == str(len(record["attempts"])) == "2"
    last = [m for m in read_jsonl(run.run_dir / "metrics.jsonl") if m["step"] is not None][-1]
    assert dom.find(cls="final-step").find(tag="dd").text() == str(last["step"]) == "30"
    table = dom.find(tag="table", cls="attempts").text()
    assert "rank 1 (host 0): raised ValueError: injected failure at step 12" in table, table
    assert "step 10" in table
