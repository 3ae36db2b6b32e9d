"""A picture of a run's report page, taken by headless Chromium.

    python bench/screenshot.py REPORT_HTML OUT_PNG [--width 1280] [--height 2400]

The page is one self-contained file (no script, nothing loaded), so the
browser needs no network; it is only started, asked for one screenshot or
one DOM dump, and ended. ``tests/test_report.py`` imports ``screenshot``
and ``dump_dom`` from here. Chromium: ``apt-get install chromium`` on
Debian; the binary is found as ``chromium`` or ``chromium-browser`` on PATH,
or as ``$CHROMIUM``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TIMEOUT_S = 60

# No sandbox (the tests run as root, where Chromium refuses it), no GPU,
# no first-run work, no background networking: a plain renderer of one file.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
]


class ChromiumMissing(RuntimeError):
    pass


def find_chromium() -> str:
    """The Chromium binary, or ChromiumMissing saying how to install it."""
    for candidate in (os.environ.get("CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate:
            return candidate
    raise ChromiumMissing(
        "chromium not found (looked for $CHROMIUM, `chromium` and `chromium-browser` on PATH); "
        "install it, e.g. `apt-get install chromium` on Debian, or set CHROMIUM=/path/to/chromium"
    )


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    # A fresh profile each time: no state shared between calls or with a
    # browser the user has open.
    with tempfile.TemporaryDirectory(prefix="meshrun-chromium-") as profile:
        cmd = [find_chromium(), *FLAGS, f"--user-data-dir={profile}", *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"chromium did not finish within {timeout:.0f} s: {' '.join(cmd)}") from e
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited with {proc.returncode}: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return proc


def _url(html_path: str | os.PathLike) -> str:
    path = Path(html_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no such page: {path}")
    return path.as_uri()


def dump_dom(html_path: str | os.PathLike, width: int = 1280, height: int = 2400, timeout: float = TIMEOUT_S) -> str:
    """The page's DOM as Chromium serializes it after loading and laying it out."""
    proc = _run([f"--window-size={width},{height}", "--dump-dom", _url(html_path)], timeout)
    return proc.stdout


def screenshot(html_path: str | os.PathLike, png_path: str | os.PathLike, width: int = 1280, height: int = 2400, timeout: float = TIMEOUT_S) -> Path:
    """Renders the page at ``width`` x ``height`` CSS pixels into ``png_path``."""
    out = Path(png_path).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    _run([f"--window-size={width},{height}", f"--screenshot={out}", _url(html_path)], timeout)
    if not out.is_file() or out.stat().st_size == 0:
        raise RuntimeError(f"chromium reported success but wrote no screenshot to {out}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="the report page, e.g. runs/NAME/report.html")
    parser.add_argument("out", help="where to write the PNG")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=2400)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds to wait for chromium")
    args = parser.parse_args()
    try:
        out = screenshot(args.report, args.out, args.width, args.height, args.timeout)
    except (ChromiumMissing, FileNotFoundError, RuntimeError) as e:
        print(f"screenshot: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, (ChromiumMissing, FileNotFoundError)) else 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
