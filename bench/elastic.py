"""Elastic runs on this machine: what losing a host and growing back cost.

Each round runs the GPT (``examples/gpt.py --fsdp 2 --tensor 2``, small by
default: 2 layers, 32 wide) on 4 hosts that share nothing (network
namespaces; host 0 runs ``meshrun run --hosts 2:4 --listen``, the others
``meshrun join``), 1 process x 2 CPU devices each, a checkpoint every 4
steps, each step paced to 0.3 s so the round can be steered. Two cases
side by side, alternating:

  elastic   after the first commit, every process of host 1 is killed (the
            host is lost for good). The restart waits ``--rejoin-timeout``
            for it, runs on 2 hosts, and once it has committed there host 1
            joins again and the run grows back to 4.
  restart   the same kill, but of host 1's worker alone (its agent lives):
            the restart runs on 4 hosts at once. What any restart costs.

From the run's own ``events.jsonl`` and ``metrics.jsonl``:

  loss -> first step      the kill to the first step reported by the next
                          attempt (minus the pace), with its parts:
                          detect (the failure recorded), wait (the rejoin
                          wait, attempt start -> launch), start (launch ->
                          first step: interpreters or spares, restore onto
                          the new mesh, compilation)
  grow -> first step      the returning host's join (``host_waiting``) to
                          the first step on 4 hosts: the save asked for, the
                          stop, the larger attempt's start
  resize (goodput)        ``goodput.json``'s resize part of the run

Needs root (namespaces).

    python bench/elastic.py [--rounds 3] [--rejoin-timeout 5] [--cases elastic,restart] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import jsonl, publish, wait

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from hostsrun import listen_addr, run_args, start_joins  # noqa: E402
from nshosts import NsHosts, nshosts_unavailable  # noqa: E402

PACED = ROOT / "tests" / "scripts" / "gpt_paced.py"
MESHRUN = Path(sys.executable).parent / "meshrun"
PACE_S = 0.3
SMALL = ["--batch-size", "8", "--seq-len", "32", "--d-model", "32", "--layers", "2", "--heads", "4", "--eval-every", "100000", "--eval-batches", "1"]


def one_round(case: str, i: int, steps: int, rejoin: float) -> dict:
    with NsHosts(4) as hosts:
        env = {"MESHRUN_TOKEN": secrets.token_hex(32), "GPT_PACE_S": str(PACE_S)}
        name = f"{case}{i}"
        launch = ["-n", "4", "--devices-per-proc", "2", "--platform", "cpu", "--quiet", "--tee", "none", "--checkpoint-every", "4", "--max-failures", "2", "--rejoin-timeout", str(rejoin), "--join-timeout", "120"]
        train = [str(PACED), *SMALL, "--fsdp", "2", "--tensor", "2", "--steps", str(steps), "--data-dir", str(hosts.shared / "data")]
        controller = hosts.popen(0, run_args(hosts, [*launch, *train], name, count="2:4"), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        start_joins(hosts, env, timeout=120)
        run_dir = hosts.tmp(0) / "runs" / name
        events = lambda kind=None: [e for e in jsonl(run_dir / "events.jsonl") if kind is None or e["event"] == kind]  # noqa: E731
        wait(lambda: controller.poll() is not None or events("checkpoint_committed"), 600, "the first commit")
        if controller.poll() is not None:
            raise SystemExit(controller.communicate()[1])
        ip1 = hosts.addr(1)
        host1 = next(e["host"] for e in events("agent_joined") if e["ip"] == ip1)
        killed_at = time.time()
        if case == "elastic":
            for pid in hosts.pids(1):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            wait(lambda: controller.poll() is not None or [e for e in events("checkpoint_committed") if e["attempt"] == 2], 600, "a commit on 2 hosts")
            hosts.popen(1, [str(MESHRUN), "join", listen_addr(hosts), "--join-timeout", "120"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            worker = next(e["pid"] for e in events("worker_started") if e["attempt"] == 1 and e["host"] == host1)
            os.kill(worker, signal.SIGKILL)
        _, err = controller.communicate(timeout=900)
        if controller.returncode != 0:
            raise SystemExit(f"{case} round {i} failed:\n{err}")
        metrics = jsonl(run_dir / "metrics.jsonl")
        goodput = json.loads((run_dir / "goodput.json").read_text())
        every = events()

    def first(kind, attempt):
        return next(e["time"] for e in every if e["event"] == kind and e.get("attempt") == attempt)

    def first_step(attempt):
        return next(m["time"] for m in metrics if m["attempt"] == attempt and "loss" in m["metrics"]) - PACE_S

    out = {
        "detect": next(e["time"] for e in every if e["event"] == "worker_failed") - killed_at,
        "wait": first("launched", 2) - first("attempt_started", 2),
        "start": first_step(2) - first("launched", 2),
        "loss_to_step": first_step(2) - killed_at,
        "hosts_after_loss": next((e["hosts"] for e in every if e["event"] == "resized" and e["attempt"] == 2), 4),
        "resize_s": goodput["seconds"]["resize"],
    }
    if case == "elastic":
        joined = first("host_waiting", 2)
        out["grow_save"] = first("attempt_ended", 2) - joined
        out["grow_to_step"] = first_step(3) - joined
        out["grow_start"] = first_step(3) - first("launched", 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rejoin-timeout", type=float, default=5.0)
    parser.add_argument("--cases", default="elastic,restart", help="which cases to run (the suite's short form runs elastic alone)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    reason = nshosts_unavailable()
    if reason is not None:
        raise SystemExit(f"needs network namespaces: {reason}")
    cases = args.cases.split(",")
    unknown = set(cases) - {"elastic", "restart"}
    if unknown or "elastic" not in cases:
        raise SystemExit(f"--cases takes elastic and optionally restart, got {args.cases!r}")
    rounds: dict[str, list[dict]] = {c: [] for c in cases}
    for i in range(args.rounds):
        for case in rounds:
            rounds[case].append(one_round(case, i, args.steps, args.rejoin_timeout))
            print(f"round {i} {case}: {json.dumps(rounds[case][-1])}", file=sys.stderr)
    median = {case: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for case, rs in rounds.items()}
    e, r = median["elastic"], median.get("restart")

    def both(key: str, unit: str = " s", digits: int = 2) -> str:
        text = f"{e[key]:.{digits}f}{unit}"
        return text if r is None else f"{text} (restart: {r[key]:.{digits}f}{unit})"

    rows = [
        ("hosts after the loss", both("hosts_after_loss", "", 0)),
        ("loss -> first step", both("loss_to_step")),
        ("  detect", both("detect")),
        (f"  wait for hosts (--rejoin-timeout {args.rejoin_timeout:g})", both("wait")),
        ("  launch -> first step", both("start")),
        ("grow: host joins -> first step on 4", f"{e['grow_to_step']:.2f} s"),
        ("  the save asked for and the stop", f"{e['grow_save']:.2f} s"),
        ("  launch -> first step on 4", f"{e['grow_start']:.2f} s"),
        ("resize part of goodput", both("resize_s")),
    ]
    summary = f"medians of {args.rounds} round(s); the rejoin wait is {e['wait']:.2f} s of loss -> first step"
    if r is not None:
        summary += f"; elastic / restart, loss -> first step: {e['loss_to_step'] / r['loss_to_step']:.2f}x"
    publish("## Elastic runs: a host lost, and back", ("", "median"), rows, summary, {"rounds": rounds, "median": median, "rejoin_timeout_s": args.rejoin_timeout}, args.json)


if __name__ == "__main__":
    main()
