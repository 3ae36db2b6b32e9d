"""Function mode: ``Trainer(train_fn, ...).fit()`` in this process, workers
in real processes with real jax.distributed; the configs, ``report`` and
``save`` refuse what they cannot use (the Python rows of docs/errors.md)."""

from __future__ import annotations

import json
import re
import threading
import time

import numpy as np
import pytest
from conftest import assert_none_left
from errors_page import covers, raises, says

import meshrun


def psum_fn(config):
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    ctx = meshrun.get_context()
    assert jax.distributed.is_initialized()
    total = multihost_utils.process_allgather(jnp.array([ctx.rank + 1])).sum()
    meshrun.report({"step": 0, "sum": int(total), "scale": config["scale"], "world": ctx.get_world_size(), "devices": jax.device_count()})


def failing_fn():
    ctx = meshrun.get_context()
    if ctx.rank == 1:
        raise KeyError("missing from rank 1")
    import time

    time.sleep(120)


def test_fit_runs_on_every_worker_and_returns_metrics(tmp_path):
    trainer = meshrun.Trainer(
        psum_fn,
        train_loop_config={"scale": 3},
        scaling_config=meshrun.ScalingConfig(num_workers=2, devices_per_worker=2),
        run_config=meshrun.RunConfig(name="fit", storage_path=str(tmp_path / "runs")),
    )
    result = trainer.fit()
    assert result.error is None, result.error
    assert result.status == "succeeded"
    assert result.metrics == {"step": 0, "sum": 3, "scale": 3, "world": 2, "devices": 4}
    assert result.path == str(tmp_path / "runs" / "fit")
    run = json.loads((tmp_path / "runs" / "fit" / "run.json").read_text())
    assert run["plan"]["entry"] == {"kind": "function"}
    assert_none_left(tmp_path / "runs" / "fit")


@pytest.mark.slow
def test_fit_with_two_hosts(tmp_path):
    result = meshrun.Trainer(
        psum_fn,
        train_loop_config={"scale": 1},
        scaling_config=meshrun.ScalingConfig(num_workers=2, num_hosts=2),
        run_config=meshrun.RunConfig(name="h2", storage_path=str(tmp_path / "runs")),
    ).fit()
    assert result.error is None, result.error
    assert result.metrics["sum"] == 3 and result.metrics["devices"] == 2


def test_a_failed_fit_raises_with_the_result_attached(tmp_path):
    # As Ray Train's fit() does: a script (or CI) that runs it exits non-zero.
    with pytest.raises(meshrun.TrainingFailedError) as info:
        meshrun.Trainer(
            failing_fn,
            scaling_config=meshrun.ScalingConfig(num_workers=2),
            run_config=meshrun.RunConfig(name="bad", storage_path=str(tmp_path / "runs"), tee="none"),
        ).fit()
    assert isinstance(info.value, meshrun.RunFailedError)
    assert "rank 1 raised KeyError: 'missing from rank 1'" in str(info.value)
    result = info.value.result
    assert result.status == "failed"
    assert isinstance(result.error, meshrun.RunFailedError)
    assert isinstance(result.error, meshrun.MeshrunError)
    assert "rank 1 raised KeyError: 'missing from rank 1'" in str(result.error)
    assert result.failure["rank"] == 1
    assert_none_left(tmp_path / "runs" / "bad")



@pytest.mark.parametrize(
    "scaling, message",
    [
        (meshrun.ScalingConfig(num_workers=0), "ScalingConfig.num_workers must be at least 1, got 0"),
        (meshrun.ScalingConfig(num_workers=3, num_hosts=2), "ScalingConfig.num_hosts 2 does not divide ScalingConfig.num_workers 3"),
        (meshrun.ScalingConfig(num_workers="2"), "ScalingConfig.num_workers must be an integer, or a pair (MIN, MAX) for an elastic run, got '2'"),
        (meshrun.ScalingConfig(use_gpu=True), "GPUs on host 0"),
        (meshrun.ScalingConfig(platform="tpu9"), "ScalingConfig.platform must be 'cpu', 'cuda' or 'auto', got 'tpu9'"),
    ],
)
def test_bad_scaling_config(tmp_path, scaling, message, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(meshrun.ConfigError, match=re.escape(message)):
        meshrun.Trainer(psum_fn, scaling_config=scaling, run_config=meshrun.RunConfig(storage_path=str(tmp_path / "runs"))).fit()
    assert not (tmp_path / "runs").exists()


def test_context_outside_meshrun(monkeypatch):
    monkeypatch.setattr(meshrun.reporting, "_warned", False)
    ctx = meshrun.get_context()
    assert (ctx.rank, ctx.world_size, ctx.in_meshrun) == (0, 1, False)
    with pytest.warns(RuntimeWarning, match="not running under meshrun"):
        meshrun.report({"x": 1})


@pytest.mark.parametrize(
    "config, message",
    [
        (meshrun.CheckpointConfig(num_to_keep=0), "CheckpointConfig.num_to_keep must be at least 1, got 0"),
        (meshrun.CheckpointConfig(num_to_keep=2, score_order="best"), "score_order must be 'max' or 'min', got 'best'"),
    ],
)
def test_bad_checkpoint_config(tmp_path, config, message):
    with pytest.raises(meshrun.ConfigError, match=message):
        meshrun.Trainer(psum_fn, run_config=meshrun.RunConfig(storage_path=str(tmp_path / "runs"), checkpoint_config=config)).fit()
    assert not (tmp_path / "runs").exists()


def fails_in_first_attempt():
    ctx = meshrun.get_context()
    if ctx.attempt == 1 and ctx.rank == 1:
        raise RuntimeError("first attempt fails")
    meshrun.report({"step": 1, "attempt": ctx.attempt})


def travels_across_attempts(config):
    import jax.numpy as jnp

    ctx = meshrun.get_context()

    def affine(x):
        return x * 2.0 + 1.0

    y = meshrun.jit(affine)(jnp.arange(4.0))
    if ctx.attempt == 1 and ctx.rank == 1:
        # Once the run has recorded rank 0's compile: on a loaded machine
        # rank 0 may still be compiling when rank 1 gets here, and the
        # failure would stop it first.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
            e["event"] == "executable" and e["rank"] == 0 and e["name"].endswith("affine") for e in map(json.loads, open(config["events"]).read().split("\n")[:-1])
        ):
            time.sleep(0.05)
        raise RuntimeError("first attempt fails after its first call")
    meshrun.report({"step": 1, "attempt": ctx.attempt, "y": float(y.sum())})


@pytest.mark.slow
def test_a_function_s_meshrun_jit_travels_to_the_next_attempt(tmp_path):
    """A train function's `meshrun.jit` is kept by the first attempt and
    loaded by the restart, as a script's is (the function arrives by
    cloudpickle, named as in its module)."""
    result = meshrun.Trainer(
        travels_across_attempts,
        train_loop_config={"events": str(tmp_path / "runs" / "travels" / "events.jsonl")},
        scaling_config=meshrun.ScalingConfig(num_workers=2),
        run_config=meshrun.RunConfig(name="travels", storage_path=str(tmp_path / "runs"), tee="none", failure_config=meshrun.FailureConfig(max_failures=1)),
    ).fit()
    assert result.status == "succeeded", result.error
    assert result.metrics["attempt"] == 2 and result.metrics["y"] == 16.0
    events = [json.loads(line) for line in (tmp_path / "runs" / "travels" / "events.jsonl").read_text().splitlines()]
    outcomes = sorted((e["attempt"], e["rank"], e["outcome"]) for e in events if e["event"] == "executable" and e["name"].endswith("affine"))
    assert outcomes == [(1, 0, "compiled"), (1, 1, "compiled"), (2, 0, "loaded"), (2, 1, "loaded")], outcomes


@pytest.mark.slow
def test_failure_config_restarts_a_function(tmp_path):
    result = meshrun.Trainer(
        fails_in_first_attempt,
        scaling_config=meshrun.ScalingConfig(num_workers=2),
        run_config=meshrun.RunConfig(name="again", storage_path=str(tmp_path / "runs"), tee="none", failure_config=meshrun.FailureConfig(max_failures=1)),
    ).fit()
    assert result.status == "succeeded", result.error
    assert result.attempts == 2
    assert result.metrics["attempt"] == 2
    assert_none_left(tmp_path / "runs" / "again")


@pytest.mark.parametrize(
    "failure, checkpoint, message",
    [
        (meshrun.FailureConfig(max_failures=-1), None, "FailureConfig.max_failures must be at least 0, got -1"),
        (meshrun.FailureConfig(hang_timeout_s=0), None, "FailureConfig.hang_timeout_s must be a positive number of seconds, got 0"),
        (meshrun.FailureConfig(hang_timeout_s="10"), None, "FailureConfig.hang_timeout_s must be a number of seconds, got '10'"),
        (None, meshrun.CheckpointConfig(every_n_steps=0), "CheckpointConfig.every_n_steps must be at least 1, got 0"),
    ],
)
def test_bad_failure_and_interval_config(tmp_path, failure, checkpoint, message):
    run = meshrun.RunConfig(storage_path=str(tmp_path / "runs"), failure_config=failure, checkpoint_config=checkpoint)
    with pytest.raises(meshrun.ConfigError, match=message):
        meshrun.Trainer(psum_fn, run_config=run).fit()
    assert not (tmp_path / "runs").exists()


# Rows of docs/errors.md: each refused before a run directory is made.

def fit(tmp_path, fn=lambda: None, **kwargs):
    runs = tmp_path / "runs"
    meshrun.Trainer(fn, run_config=meshrun.RunConfig(storage_path=str(runs), **kwargs.pop("run", {})), **kwargs).fit()


PY_CONFIGS = {
    "py-num-workers-zero": dict(scaling_config=meshrun.ScalingConfig(num_workers=0)),
    "py-num-workers-not-a-count": dict(scaling_config=meshrun.ScalingConfig(num_workers="4")),
    "py-num-workers-range-bad": dict(scaling_config=meshrun.ScalingConfig(num_workers=(3, 2))),
    "py-num-workers-part-of-a-host": dict(scaling_config=meshrun.ScalingConfig(num_workers=(1, 4), num_hosts=2)),
    "py-rejoin-timeout-without-range": dict(scaling_config=meshrun.ScalingConfig(num_workers=2, rejoin_timeout_s=5)),
    "py-backend-unknown": dict(scaling_config=meshrun.ScalingConfig(backend="kube")),
    "py-ray-without-address": dict(scaling_config=meshrun.ScalingConfig(backend="ray")),
    "py-control-port-out-of-range": dict(scaling_config=meshrun.ScalingConfig(control_port=70000)),
    "py-hang-timeout-not-a-number": dict(run={"failure_config": meshrun.FailureConfig(hang_timeout_s="10s")}),
    "py-start-timeout-zero": dict(run={"failure_config": meshrun.FailureConfig(start_timeout_s=0)}),
    "py-memory-every-zero": dict(run={"checkpoint_config": meshrun.CheckpointConfig(memory_every_n_steps=0)}),
    "py-spare-imports-string": dict(run={"failure_config": meshrun.FailureConfig(spare_imports="jax")}),
    "py-warm-spares-not-bool": dict(run={"failure_config": meshrun.FailureConfig(warm_spares="yes")}),
    "py-straggler-threshold-zero": dict(run={"straggler_threshold": 0}),
    "py-profile-steps-backwards": dict(run={"profile_steps": (5, 2)}),
    "py-score-order-unknown": dict(run={"checkpoint_config": meshrun.CheckpointConfig(score_order="best")}),
}
covers(*PY_CONFIGS)


@pytest.mark.parametrize("row", sorted(PY_CONFIGS))
def test_python_config_errors(row, tmp_path):
    raises(row, lambda: fit(tmp_path, **PY_CONFIGS[row]))
    assert not (tmp_path / "runs").exists()


@covers("py-resume-from-negative", "py-resume-from-not-a-step")
def test_resume_from_a_negative_step(tmp_path):
    raises("py-resume-from-negative", lambda: fit(tmp_path, run={"resume_from": -1}))
    raises("py-resume-from-not-a-step", lambda: fit(tmp_path, run={"resume_from": "latest"}))
    assert not (tmp_path / "runs").exists()


@covers("py-train-fn-not-callable")
def test_train_fn_that_is_not_callable():
    raises("py-train-fn-not-callable", lambda: meshrun.Trainer(42))


@covers("py-train-fn-unpicklable")
def test_train_fn_that_cannot_be_pickled(tmp_path):
    lock = threading.Lock()

    def uses_lock():
        with lock:
            pass

    raises("py-train-fn-unpicklable", lambda: fit(tmp_path, uses_lock))
    assert not (tmp_path / "runs").exists()


# What the worker's bootstrap called each train function with, in order.
CALLED: list[tuple] = []


def takes_config(config):
    CALLED.append((config,))


def takes_nothing():
    CALLED.append(())


def takes_config_or_nothing(config=None):
    CALLED.append((config,))


def called_by_a_worker(trainer, tmp_path, monkeypatch) -> tuple:
    """The arguments the worker's own code (meshrun._bootstrap) passes the
    trainer's function, from the payload that fit() sends, in this process."""
    from meshrun import _bootstrap
    from meshrun._native import ENV

    (tmp_path / "payload").write_bytes(trainer._payload())
    monkeypatch.setenv(ENV["scratch"], str(tmp_path))
    # Outside a run, the worker's context joins no cluster.
    monkeypatch.delenv(ENV["run_dir"], raising=False)
    CALLED.clear()
    _bootstrap._run("function", "payload", [])
    (args,) = CALLED
    return args


@pytest.mark.parametrize(
    "fn, config, expected",
    [
        # Ray Train's rule: a function that takes a config gets {} when none is given.
        (takes_config, None, ({},)),
        (takes_config_or_nothing, None, ({},)),
        (takes_config, {"lr": 0.1}, ({"lr": 0.1},)),
        (takes_nothing, None, ()),
    ],
)
def test_the_train_function_is_called_as_ray_train_calls_it(fn, config, expected, tmp_path, monkeypatch):
    assert called_by_a_worker(meshrun.Trainer(fn, train_loop_config=config), tmp_path, monkeypatch) == expected


@covers("py-train-fn-signature", "py-train-fn-takes-no-config")
def test_a_train_function_that_cannot_be_called_is_refused_before_launch(tmp_path):
    def train(config, epochs):
        pass

    def train_without_config():
        pass

    def train_by_keyword(*, config):
        pass

    raises("py-train-fn-signature", lambda: meshrun.Trainer(train))
    raises("py-train-fn-takes-no-config", lambda: meshrun.Trainer(train_without_config, train_loop_config={"lr": 0.1}))
    with pytest.raises(meshrun.ConfigError, match=re.escape("got train_by_keyword(*, config)")):
        meshrun.Trainer(train_by_keyword)
    assert not (tmp_path / "runs").exists()


class PlanMade(Exception):
    """Stands in for the run: fit() got as far as launching it."""


def test_storage_path_none_is_the_default_storage_path(tmp_path, monkeypatch):
    # Ray Train's RunConfig default.
    from meshrun._native import DEFAULTS

    def launch(plan, **_):
        raise PlanMade(plan)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(meshrun.trainer._native, "run", launch)
    with pytest.raises(PlanMade) as made:
        meshrun.Trainer(takes_config, run_config=meshrun.RunConfig(name="dflt", storage_path=None)).fit()
    (plan,) = made.value.args
    assert (tmp_path / plan.run_dir).resolve() == (tmp_path / str(DEFAULTS["storage_path"]) / "dflt").resolve()


def always_fails():
    raise RuntimeError("fails every attempt")


@covers("py-max-failures-used-up")
def test_a_run_past_its_max_failures_names_the_failure_config(tmp_path):
    with pytest.raises(meshrun.TrainingFailedError) as info:
        meshrun.Trainer(
            always_fails,
            run_config=meshrun.RunConfig(
                name="used", storage_path=str(tmp_path / "runs"), tee="none", progress=False,
                failure_config=meshrun.FailureConfig(max_failures=1, warm_spares=False),
            ),
        ).fit()  # fmt: skip
    says("py-max-failures-used-up", str(info.value))
    assert "--max-failures" not in str(info.value) and "--max-failures" not in str(info.value.result.error)
    assert info.value.result.attempts == 2


@covers("py-memory-limit-not-settable")
def test_a_memory_limit_that_cannot_be_set_names_scaling_config(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHRUN_CGROUP", "0")
    with pytest.raises(meshrun.TrainingFailedError) as info:
        fit(tmp_path, scaling_config=meshrun.ScalingConfig(memory_per_worker="512MiB"), run={"name": "mem", "tee": "none", "progress": False})
    says("py-memory-limit-not-settable", str(info.value))


@covers("py-report-not-a-dict", "py-report-step-negative", "py-report-total-steps-negative")
def test_report_arguments():
    raises("py-report-not-a-dict", lambda: meshrun.report([1]))
    raises("py-report-step-negative", lambda: meshrun.report({"loss": 1.0}, step=-1))
    raises("py-report-total-steps-negative", lambda: meshrun.report({"loss": 1.0}, total_steps=-1))


@covers("py-save-outside-a-run")
def test_save_outside_a_run(monkeypatch):
    monkeypatch.delenv("MESHRUN_RUN_DIR", raising=False)
    raises("py-save-outside-a-run", lambda: meshrun.save(1, {"w": np.zeros(2)}))
