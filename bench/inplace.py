"""Survivors that keep running: what JAX's fault-tolerance mode does on CPU,
for each JAX given, before meshrun builds on it.

Three processes of ``bench/inplace_job.py`` (2 CPU devices each) run a
collective step under ``jax_enable_recoverability`` and
``multihost_utils.live_devices`` with a 1 s heartbeat and 1 s CPU
collective timeouts (XLA's least); after 40 steps process 2 is killed with
SIGKILL. Two cases, rounds alternating:

  shrink   the survivors go on alone: measured, from the kill, the first
           error a survivor sees and its first step on the 4 live devices;
  replace  a replacement, started before the kill with JAX imported (as
           meshrun's warm spares are), is let go at the kill and joins
           under process 2's id: measured, the first error, the
           replacement joining, and the first step of a survivor on all 6
           devices again, or what stopped it (nothing within 10 s).

A step's sum must equal its device count on every process that took it.
Process 0 is never killed: it hosts JAX's coordination service.

    python bench/inplace.py [--rounds 3] [--python PY ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import free_port, jsonl, publish

HERE = Path(__file__).resolve().parent
JOB = HERE / "inplace_job.py"
REJOIN_WAIT = 10.0


def records(out: Path) -> list[dict]:
    return sorted((r for p in range(3) for r in jsonl(out / f"process-{p}.jsonl")), key=lambda r: r["time"])


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def one_round(python: str, case: str, out: Path) -> dict:
    out.mkdir(parents=True)
    port = free_port()
    job = [python, str(JOB), "--processes", "3", "--port", str(port), "--out", str(out)]
    procs = [subprocess.Popen([*job, "--process", str(i)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(3)]
    if case == "replace":
        procs.append(subprocess.Popen([*job, "--process", "2", "--replacement"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        if not wait_for(lambda: any(r.get("step", 0) >= 40 for r in jsonl(out / "process-0.jsonl")), 120):
            raise SystemExit(f"{python}: the three processes did not reach step 40")
        procs[2].send_signal(signal.SIGKILL)
        killed = time.time()
        if case == "replace":
            (out / "GO").touch()
        full = 6 if case == "replace" else 4
        after = lambda: [r for r in records(out) if r["time"] > killed]  # noqa: E731
        ok = wait_for(lambda: sum(1 for r in after() if r["event"] == "step" and r["process"] == 0 and r["devices"] == full) >= 5, REJOIN_WAIT)
    finally:
        (out / "STOP").touch()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    later = [r for r in records(out) if r["time"] > killed]
    wrong = [r for r in records(out) if r["event"] == "step" and r["value"] != r["devices"]]
    first = lambda pred: next((r["time"] - killed for r in later if pred(r)), None)  # noqa: E731
    errors = [r for r in later if r["event"] == "error" and not r["replacement"]]
    return {
        "ok": ok and not wrong,
        "wrong_sums": len(wrong),
        "first_error": first(lambda r: r["event"] == "error" and not r["replacement"]),
        "error_types": sorted({r["type"] for r in errors}),
        "last_error": errors[-1]["message"] if errors else None,
        "joined": first(lambda r: r["event"] == "joined"),
        "step": first(lambda r: r["event"] == "step" and r["process"] == 0 and r["devices"] == full),
        "errors_after_kill": len(errors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--python", nargs="+", default=[sys.executable], help="interpreters whose JAX to probe")
    parser.add_argument("--cases", nargs="+", choices=("shrink", "replace"), default=["shrink", "replace"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result: dict = {"rounds": {}, "median": {}, "jax": {}}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for python in args.python:
            version = subprocess.run([python, "-c", "import jax; print(jax.__version__)"], capture_output=True, text=True, check=True).stdout.strip()
            result["jax"][python] = version
            for case in args.cases:
                label = f"JAX {version} {case}"
                result["rounds"][label] = []
            for i in range(args.rounds):
                for case in args.cases if i % 2 == 0 else args.cases[::-1]:
                    r = one_round(python, case, Path(tmp) / f"{version}-{case}-{i}")
                    result["rounds"][f"JAX {version} {case}"].append(r)
            for case in args.cases:
                label = f"JAX {version} {case}"
                rs = result["rounds"][label]
                good = [r for r in rs if r["ok"]]
                med = {k: statistics.median(r[k] for r in good) for k in ("first_error", "step")} if good else {}
                result["median"][label] = {"ok_rounds": len(good), "rounds": len(rs), **med}
                if good:
                    where = "all 6" if case == "replace" else "the 4 live"
                    text = f"{len(good)}/{len(rs)} rounds went on; first error {med['first_error']:.2f} s, first step on {where} devices {med['step']:.2f} s"
                else:
                    last = rs[-1]
                    joined = "joined" if last["joined"] is not None else "no join"
                    message = (last["last_error"] or "-").splitlines()[0][:120]
                    text = f"0/{len(rs)} rounds went on ({joined}); errors seen: {', '.join(last['error_types']) or 'none'}; last: {message}"
                rows.append((label, text))
    summary = "seconds after the SIGKILL of process 2 of 3 (medians of the rounds that went on)"
    publish("Survivors under jax_enable_recoverability on CPU", ("JAX, case", "outcome"), rows, summary, result, args.json)


if __name__ == "__main__":
    main()
