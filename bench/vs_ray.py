"""meshrun against Ray Train's JaxTrainer, side by side in one run.

Brings up a one-node Ray cluster on 127.0.0.1 (4 CPUs) before any timing,
then, each round and in rotating order, runs the same two programs with
2 workers three ways, all connecting to that cluster where Ray is used:
  - meshrun, local backend:  Trainer(...).fit()
  - meshrun on Ray:          Trainer(..., ScalingConfig(backend="ray", ray_address=...)).fit()
  - Ray Train's JaxTrainer:  JaxTrainer(...).fit()
The programs:
  - steps: 10 jitted steps with a report per step (meshrun.report or
    ray.train.report), then, under meshrun, a timed loop of report calls;
  - digits: examples/digits_dp.py unmodified (400 steps, meshrun.report per
    step; outside meshrun that call does nothing, so under JaxTrainer the
    digits program reports nothing).
Measured: end-to-end wall (from constructing the trainer to fit()
returning), time to the first step (from the same start to rank 0 calling
report for step 1), and the cost of one report call. Each worker also
records jax.process_count(): JaxTrainer does not initialize
jax.distributed on CPU, so its workers run as independent processes.
Goals: meshrun on Ray at least 5x faster end to end than JaxTrainer; a
report call under 100 microseconds.

    python bench/vs_ray.py [--rounds 3] [--report-calls 5000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import publish

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits_dp.py"
TOOLS = ("meshrun local", "meshrun on Ray", "JaxTrainer")


def _rank_and_report(tool: str):
    if tool == "JaxTrainer":
        import ray.train

        return ray.train.get_context().get_world_rank(), ray.train.report
    import meshrun

    return meshrun.get_context().rank, meshrun.report


def _mark(config: dict[str, Any], what: str, value: Any) -> None:
    Path(config["marks"], what).write_text(json.dumps(value))


def steps_program(config: dict[str, Any]) -> None:
    """10 jitted steps, a report after each; rank 0 notes when step 1 is
    done and what each report call cost."""
    import jax
    import jax.numpy as jnp

    rank, report = _rank_and_report(config["tool"])
    step = jax.jit(lambda x: jnp.tanh(x @ x) * 0.5)
    x = jnp.ones((128, 128), jnp.float32) / 128
    per_step = []
    for i in range(1, 11):
        x = step(x)
        loss = float(x.mean())
        if i == 1 and rank == 0:
            _mark(config, "first_step", time.time())
        t = time.perf_counter()
        report({"step": i, "loss": loss})
        per_step.append(time.perf_counter() - t)
    if rank != 0:
        return
    _mark(config, "per_step_report", per_step)
    _mark(config, "process_count", jax.process_count())
    calls = config["report_calls"] if config["tool"] != "JaxTrainer" else 0
    if calls:
        costs = {}
        for label, value in (("float", 0.5), ("jax scalar", x.mean())):
            times = []
            for i in range(calls):
                t = time.perf_counter()
                report({"step": 11 + i, "loss": value})
                times.append(time.perf_counter() - t)
            costs[label] = statistics.median(times)
        _mark(config, "report_call", costs)


def digits_program(config: dict[str, Any]) -> None:
    """examples/digits_dp.py as its own ``__main__``; the first report call
    (step 0, before any update) is noted, then passed on unchanged."""
    import runpy
    import sys

    import meshrun

    rank, _ = _rank_and_report(config["tool"])
    original = meshrun.report
    seen = []

    def noting(metrics, *args, **kwargs):
        if not seen and rank == 0:
            seen.append(True)
            _mark(config, "first_step", time.time())
        return original(metrics, *args, **kwargs)

    meshrun.report = noting
    sys.argv = [str(DIGITS)]
    try:
        runpy.run_path(str(DIGITS), run_name="__main__")
    finally:
        meshrun.report = original
    if rank == 0:
        import jax

        _mark(config, "process_count", jax.process_count())


def run_once(tool: str, program, address: str, work: Path, tag: str, report_calls: int) -> dict[str, Any]:
    marks = work / "marks" / tag
    marks.mkdir(parents=True)
    config = {"tool": tool, "marks": str(marks), "report_calls": report_calls}
    t0 = time.time()
    if tool == "JaxTrainer":
        import ray.train
        from ray.train.v2.jax import JaxTrainer

        result = JaxTrainer(
            program,
            train_loop_config=config,
            scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
            run_config=ray.train.RunConfig(name=tag, storage_path=str(work / "ray-results")),
        ).fit()
        assert result.error is None, result.error
    else:
        import meshrun

        scaling = meshrun.ScalingConfig(num_workers=2, devices_per_worker=1)
        if tool == "meshrun on Ray":
            scaling = meshrun.ScalingConfig(num_workers=2, devices_per_worker=1, backend="ray", ray_address=address, control_host="127.0.0.1")
        result = meshrun.Trainer(program, train_loop_config=config, scaling_config=scaling, run_config=meshrun.RunConfig(name=tag, storage_path=str(work / "runs"), tee="none")).fit()
        assert result.status == "succeeded", result.error
    wall = time.time() - t0
    read = lambda name: json.loads((marks / name).read_text()) if (marks / name).exists() else None  # noqa: E731
    return {
        "wall_s": wall,
        "first_step_s": read("first_step") - t0,
        "process_count": read("process_count"),
        "per_step_report_s": read("per_step_report"),
        "report_call_s": read("report_call"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--report-calls", type=int, default=5000)
    parser.add_argument("--programs", default="steps,digits")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import ray
    from ray.cluster_utils import Cluster

    programs = {"steps": steps_program, "digits": digits_program}
    chosen = [p for p in args.programs.split(",") if p]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {t: [] for t in TOOLS} for p in chosen}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    try:
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for r in range(args.rounds):
                order = TOOLS[r % 3 :] + TOOLS[: r % 3]  # each tool goes first once every 3 rounds
                for p in chosen:
                    for tool in order:
                        tag = f"{p}-{tool.replace(' ', '_')}-{r}"
                        runs[p][tool].append(run_once(tool, programs[p], cluster.address, work, tag, args.report_calls if p == "steps" else 0))
                        print(f"round {r} {p:6} {tool:15} wall {runs[p][tool][-1]['wall_s']:6.2f} s  first step {runs[p][tool][-1]['first_step_s']:6.2f} s", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()

    med = lambda xs: statistics.median(xs)  # noqa: E731
    result: dict[str, Any] = {"rounds": args.rounds, "runs": runs, "median": {}}
    rows = []
    for p in chosen:
        result["median"][p] = {}
        for tool in TOOLS:
            rs = runs[p][tool]
            m = {"wall_s": med([x["wall_s"] for x in rs]), "first_step_s": med([x["first_step_s"] for x in rs]), "process_count": rs[0]["process_count"]}
            if rs[0]["per_step_report_s"]:
                m["per_step_report_s"] = med([v for x in rs for v in x["per_step_report_s"]])
            result["median"][p][tool] = m
            rows.append((f"{p}: {tool}", f"{m['wall_s']:.2f} / {m['first_step_s']:.2f} / {m['process_count']}"))
        ray_m, jt = result["median"][p]["meshrun on Ray"], result["median"][p]["JaxTrainer"]
        result["median"][p]["JaxTrainer_over_meshrun_on_ray"] = jt["wall_s"] / ray_m["wall_s"]
        result["median"][p]["JaxTrainer_over_meshrun_on_ray_first_step"] = jt["first_step_s"] / ray_m["first_step_s"]
    summary = []
    for p in chosen:
        summary.append(f"{p}: JaxTrainer / meshrun on Ray end to end {result['median'][p]['JaxTrainer_over_meshrun_on_ray']:.2f}x, first step {result['median'][p]['JaxTrainer_over_meshrun_on_ray_first_step']:.2f}x")
    if "steps" in chosen:
        calls = [x["report_call_s"] for t in TOOLS[:2] for x in runs["steps"][t] if x["report_call_s"]]
        if calls:
            result["report_call_us"] = {k: med([c[k] for c in calls]) * 1e6 for k in calls[0]}
            summary.append("meshrun.report call (median of per-run medians, µs): " + ", ".join(f"{k} {v:.1f}" for k, v in result["report_call_us"].items()))
        jt_steps = result["median"]["steps"]["JaxTrainer"].get("per_step_report_s")
        if jt_steps is not None:
            summary.append(f"ray.train.report call inside JaxTrainer (median over the 10 steps): {jt_steps * 1e3:.1f} ms")
    publish(
        f"meshrun vs Ray Train JaxTrainer, 2 workers, one-node Ray cluster (4 CPUs) already up, {args.rounds} round(s)",
        ("program: launcher", "median wall (s) / first step (s) / jax.process_count()"),
        rows,
        "\n".join(summary),
        result,
        args.json,
    )


if __name__ == "__main__":
    main()
