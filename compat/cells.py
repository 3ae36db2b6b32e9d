"""The compatibility matrix: meshrun's wheel installed into virtualenvs of
other Pythons and JAXes, each running the suite in tests/compat/.

A cell is a lock file here, ``compat/py<PYTHON>-jax<JAX>.lock``: the exact
packages of a user's environment (JAX and what it brings, numpy,
cloudpickle, pytest; no Ray). Its venv lives in ``.compat/<cell>/`` and is
made again only when the lock file changes; the wheel is installed into it
with ``--no-index``, so the wheel must find every dependency it declares
already there, and must leave the environment as the lock file says.

    python compat/cells.py wheel                  # build dist/meshrun-*.whl if its sources changed
    python compat/cells.py run [CELL ...]         # every cell (or those named), one at a time
    python compat/cells.py run --short CELL       # the tests marked `short` only
    python compat/cells.py prepare CELL ...       # make the venvs and install the wheel, run nothing
    python compat/cells.py run --offline CELL     # never make a venv (pip reaches PyPI): say it is missing
    python compat/cells.py list                   # the cells and where their Pythons are

Only the standard library: it runs under any Python 3.11+ (``make`` runs it
under .venv's, whose maturin builds the wheel).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "compat"
VENVS = ROOT / ".compat"
DIST = ROOT / "dist"
SUITE = ROOT / "tests" / "compat"
# What the wheel is built from: a newer file here makes `wheel` build again.
WHEEL_SOURCES = ["crates", "python", "Cargo.toml", "Cargo.lock", "pyproject.toml", "README.md"]
CELL = re.compile(r"^py(\d+\.\d+)-jax([\d.]+)$")


class Missing(SystemExit):
    """Something the matrix needs and cannot make itself (a Python)."""


def cells() -> list[str]:
    return sorted(p.stem for p in LOCKS.glob("*.lock") if CELL.match(p.stem))


def find_python(version: str) -> Path:
    """The interpreter of Python ``version`` (e.g. "3.12"): pyenv's newest
    patch release of it, else ``python3.12`` on PATH."""
    roots = []
    pyenv = shutil.which("pyenv")
    if pyenv:
        out = subprocess.run([pyenv, "root"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            roots.append(Path(out.stdout.strip()))
    if os.environ.get("PYENV_ROOT"):
        roots.append(Path(os.environ["PYENV_ROOT"]))
    roots.append(Path.home() / ".pyenv")
    for root in roots:
        found = []
        for exe in glob.glob(str(root / "versions" / f"{version}.*" / "bin" / f"python{version}")):
            patch = Path(exe).parent.parent.name.split(".")[2]
            if patch.isdigit():
                found.append((int(patch), Path(exe)))
        if found:
            return max(found)[1]
    on_path = shutil.which(f"python{version}")
    if on_path:
        return Path(on_path)
    raise Missing(
        f"compat: Python {version} not found: neither pyenv ({', '.join(map(str, roots))}) has a "
        f"versions/{version}.* nor is python{version} on PATH; install it (`pyenv install {version}`) "
        f"or leave out the cells of Python {version}"
    )


def newest_mtime(paths: list[str]) -> float:
    newest = 0.0
    for name in paths:
        path = ROOT / name
        if path.is_file():
            newest = max(newest, path.stat().st_mtime)
        elif path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames[:] = [d for d in dirnames if d not in ("target", "__pycache__")]
                for f in filenames:
                    if not f.endswith((".pyc", ".so")):
                        newest = max(newest, os.stat(os.path.join(dirpath, f)).st_mtime)
    return newest


def wheel_path() -> Path | None:
    found = sorted(DIST.glob("meshrun-*-abi3-*.whl"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def build_wheel() -> Path:
    """dist/meshrun-<version>-cp311-abi3-<platform>.whl, built with maturin
    (the one beside this interpreter) unless it is newer than its sources."""
    wheel = wheel_path()
    if wheel is not None and wheel.stat().st_mtime >= newest_mtime(WHEEL_SOURCES):
        return wheel
    maturin = Path(sys.executable).parent / "maturin"
    if not maturin.exists():
        maturin = Path(shutil.which("maturin") or "maturin")
        if not maturin.exists():
            raise Missing("compat: building the wheel needs maturin: run it under .venv's Python (`make wheel`)")
    for old in DIST.glob("meshrun-*.whl"):
        old.unlink()
    # The same interpreter as `make install`'s `maturin develop`: cargo then
    # reuses what that one compiled.
    cmd = [str(maturin), "build", "--release", "--quiet", "-o", str(DIST), "-i", sys.executable]
    print("compat: " + " ".join(cmd[:5]) + " ...", flush=True)
    env = dict(os.environ)
    if sys.prefix != sys.base_prefix:  # as `make install` runs maturin develop
        env["VIRTUAL_ENV"] = sys.prefix
    subprocess.run(cmd, cwd=ROOT, check=True, env=env)
    wheel = wheel_path()
    if wheel is None:
        raise SystemExit("compat: maturin built no abi3 wheel into dist/")
    return wheel


def run(cmd: list, **kw) -> None:
    done = subprocess.run([str(c) for c in cmd], **kw)
    if done.returncode != 0:
        raise SystemExit(f"compat: failed ({done.returncode}): {' '.join(map(str, cmd))}")


def pins(text: str) -> list[str]:
    return sorted(line.strip().lower() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def make_venv(cell: str, offline: bool = False) -> Path:
    """``.compat/<cell>``: the lock file's packages, exactly (made again when
    the lock file or the Python changes). ``offline``: a venv that is not
    there or not up to date is an error, not made (tests reach no index)."""
    version = CELL.match(cell).group(1)
    python = find_python(version)
    lock = LOCKS / f"{cell}.lock"
    venv = VENVS / cell
    stamp = venv / ".made-from"
    want = f"{python}\n{hashlib.sha256(' '.join(pins(lock.read_text())).encode()).hexdigest()}\n"
    if stamp.exists() and stamp.read_text() == want:
        return venv
    if offline:
        raise Missing(f"compat: the venv of cell {cell} is missing or older than {lock.relative_to(ROOT)}: make it with `make compat-short-venv` (or `python compat/cells.py prepare {cell}`)")
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    print(f"compat: {cell}: making {venv.relative_to(ROOT)} with {python} from {lock.relative_to(ROOT)}", flush=True)
    run([python, "-m", "venv", venv])
    run([venv / "bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "-r", lock])
    stamp.write_text(want)
    print(f"compat: {cell}: venv made in {time.monotonic() - started:.0f} s", flush=True)
    return venv


def install_wheel(venv: Path, wheel: Path, cell: str) -> None:
    """The wheel as a user installs it: without reaching an index, so every
    dependency it declares must already be there; then the environment must
    still be exactly the lock file's, plus meshrun."""
    stamp = venv / ".wheel"
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    pip = [venv / "bin/python", "-m", "pip", "--disable-pip-version-check"]
    if not (stamp.exists() and stamp.read_text() == digest):
        run([*pip, "uninstall", "--quiet", "--yes", "meshrun"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run([*pip, "install", "--quiet", "--no-index", wheel])
        stamp.write_text(digest)
    frozen = subprocess.run([str(p) for p in pip] + ["freeze", "--exclude", "meshrun"], capture_output=True, text=True, check=True).stdout
    locked = (LOCKS / f"{cell}.lock").read_text()
    if pins(frozen) != pins(locked):
        extra = sorted(set(pins(frozen)) - set(pins(locked)))
        gone = sorted(set(pins(locked)) - set(pins(frozen)))
        raise SystemExit(f"compat: {cell}: the venv is not its lock file after installing the wheel: added {extra}, missing {gone}")
    run([*pip, "check"], stdout=subprocess.DEVNULL)


def run_cell(cell: str, wheel: Path, short: bool, extra: list[str], offline: bool = False) -> dict:
    started = time.monotonic()
    try:
        venv = make_venv(cell, offline)
        install_wheel(venv, wheel, cell)
    except SystemExit as e:  # the other cells still run; the table says why this one did not
        print(e, file=sys.stderr, flush=True)
        return {"cell": cell, "code": f"no venv: {e}", "setup": time.monotonic() - started, "seconds": time.monotonic() - started, "tests": {}, "jax": "?"}
    setup = time.monotonic() - started
    junit = venv / "junit.xml"
    junit.unlink(missing_ok=True)
    # pytest from the cell's venv, with the suite's own configuration
    # (tests/compat/pytest.ini), from a folder with no meshrun in it: the
    # suite imports meshrun from the installed wheel only.
    cmd = [venv / "bin/pytest", "-c", SUITE / "pytest.ini", "--rootdir", SUITE, "--junitxml", junit, *(["-m", "short"] if short else []), *extra, SUITE]
    print(f"compat: {cell}: {' '.join(map(str, cmd[1:]))}", flush=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    code = subprocess.run([str(c) for c in cmd], cwd=venv, env=env).returncode
    return {"cell": cell, "code": code, "setup": setup, "seconds": time.monotonic() - started, "tests": read_junit(junit), "jax": jax_of(venv)}


def jax_of(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin/python"), "-c", "import jax, jaxlib, sys; print(sys.version.split()[0], jax.__version__, jaxlib.__version__)"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def read_junit(path: Path) -> dict[str, tuple[str, float]]:
    if not path.exists():
        return {}
    out = {}
    for case in ET.parse(path).iter("testcase"):
        outcome = "pass"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "FAIL"
            elif child.tag == "skipped":
                outcome = "skip"
        out[case.get("name")] = (outcome, float(case.get("time") or 0))
    return out


def outcome(code: int | str) -> str:
    if code == 0:
        return "pass"
    return f"FAIL ({code})" if isinstance(code, str) else f"FAIL (pytest exit {code})"


def table(results: list[dict], wheel: Path) -> str:
    names = sorted({n for r in results for n in r["tests"]})
    lines = [f"wheel: {wheel.name}", ""]
    head = ["test"] + [r["cell"] for r in results]
    rows = [[n] + [f"{r['tests'][n][0]} {r['tests'][n][1]:.0f}s" if n in r["tests"] else "-" for r in results] for n in names]
    rows.append(["Python, JAX, jaxlib"] + [r["jax"] for r in results])
    rows.append(["venv + wheel set-up"] + [f"{r['setup']:.0f} s" for r in results])
    rows.append(["cell in all"] + [f"{r['seconds']:.0f} s" for r in results])
    rows.append(["result"] + [outcome(r["code"]) for r in results])
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    for row in [head, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("wheel", help="build the wheel into dist/ if its sources changed")
    sub.add_parser("list", help="the cells and their Pythons")
    go = sub.add_parser("run", help="run the suite in each cell (all when none is named)")
    go.add_argument("cells", nargs="*")
    go.add_argument("--short", action="store_true", help="only the tests marked short")
    go.add_argument("--offline", action="store_true", help="never make a venv (that needs PyPI): fail saying it is missing")
    go.add_argument("--pytest", action="append", default=[], help="one more argument for pytest (repeatable)")
    prep = sub.add_parser("prepare", help="make the cells' venvs and install the wheel into them")
    prep.add_argument("cells", nargs="*")
    args = parser.parse_args()
    if args.command == "wheel":
        print(build_wheel().relative_to(ROOT))
        return 0
    if args.command == "list":
        for cell in cells():
            try:
                where = find_python(CELL.match(cell).group(1))
            except Missing as e:
                where = str(e)
            print(f"{cell}\t{where}")
        return 0
    chosen = args.cells or cells()
    unknown = [c for c in chosen if c not in cells()]
    if unknown:
        parser.error(f"no such cell {unknown}; the cells are the lock files in compat/: {cells()}")
    for cell in chosen:  # every Python first: say at once what is missing
        find_python(CELL.match(cell).group(1))
    if args.command == "prepare":
        wheel = build_wheel()
        for cell in chosen:
            install_wheel(make_venv(cell), wheel, cell)
        return 0
    wheel = build_wheel()
    results = [run_cell(cell, wheel, args.short, args.pytest, args.offline) for cell in chosen]
    print()
    print(table(results, wheel))
    return 0 if all(r["code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
