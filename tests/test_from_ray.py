"""Programs written for Ray Train's ``JaxTrainer``, run by ``meshrun.Trainer``
with their imports changed: folders handed to ``report`` by one rank
(``Checkpoint.from_directory``), a loop without a config argument, a failed
``fit()`` that raises, the checkpoints on the ``Result``. Real workers,
real ``jax.distributed``, a real SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from errors_page import covers, raises, says

import meshrun

pytestmark = pytest.mark.slow
MESHRUN = os.path.join(os.path.dirname(sys.executable), "meshrun")

STEPS, KILL_AT = 8, 5


def ray_style_loop():
    """Rank 0 writes an Orbax checkpoint folder of its own every other step
    and hands it to ``report``; the other rank reports metrics only. Rank 0
    is SIGKILLed at step 5 of the first attempt. Under ``jax.distributed``,
    Orbax synchronises every process unless told which ones take part: each
    rank uses it alone (``active_processes``), as a Ray Train program whose
    rank 0 alone writes must."""
    import signal
    import tempfile

    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils

    ctx = meshrun.get_context()

    def alone():
        only_me = ocp.options.MultiprocessingOptions(primary_host=ctx.rank, active_processes={ctx.rank})
        return ocp.StandardCheckpointer(multiprocessing_options=only_me)

    w, start = np.zeros(4, np.float32), 0
    checkpoint = meshrun.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder, alone() as loader:
            state = loader.restore(os.path.join(folder, "state"))
        w, start = np.asarray(state["w"]), int(state["step"]) + 1
    for step in range(start, STEPS):
        # A collective each step, so the ranks move together as SPMD ones do.
        w = w + np.asarray(multihost_utils.process_allgather(jnp.ones(4)).sum(axis=0))
        if ctx.attempt == 1 and ctx.rank == 0 and step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        metrics = {"train_loss": 1.0 / (step + 1), "attempt": ctx.attempt, "start": start}
        if ctx.rank == 0 and step % 2 == 1:
            with tempfile.TemporaryDirectory() as folder:
                with alone() as saver:
                    saver.save(os.path.join(folder, "state"), {"w": w, "step": np.int64(step)})
                meshrun.report(metrics, checkpoint=meshrun.Checkpoint.from_directory(folder))
        else:
            meshrun.report(metrics)


def test_a_folder_from_rank_0_alone_commits_and_a_killed_run_resumes_from_it(tmp_path):
    result = meshrun.Trainer(
        ray_style_loop,
        scaling_config=meshrun.ScalingConfig(num_workers=2),
        run_config=meshrun.RunConfig(
            name="ray", storage_path=str(tmp_path / "runs"), tee="none", progress=False,
            failure_config=meshrun.FailureConfig(max_failures=1),
        ),
    ).fit()  # fmt: skip
    assert result.status == "succeeded" and result.attempts == 2, result.error
    # Steps 1 and 3 committed before the kill at 5; the restart resumed
    # after step 3 and committed 5 and 7.
    assert result.metrics["start"] == 4, result.metrics
    steps = [c.step for c, _ in result.best_checkpoints]
    assert steps == [1, 3, 5, 7], steps
    assert result.best_checkpoints[-1][1]["train_loss"] == pytest.approx(1 / 8)
    assert result.checkpoint.step == 7
    with result.checkpoint.as_directory() as folder:
        # 2 ranks add 1 each step: 8 steps. Read in a process of its own:
        # JAX's backend in the test process would make every later fork
        # (Ray starting a local cluster) warn.
        read = "import sys, orbax.checkpoint as ocp; print(ocp.StandardCheckpointer().restore(sys.argv[1])['w'].tolist())"
        out = subprocess.run([sys.executable, "-c", read, os.path.join(folder, "state")], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [16.0] * 4, out.stdout
    copy = result.checkpoint.to_directory(tmp_path / "copy")
    assert sorted(os.listdir(copy)) == ["state"]
    with open(os.path.join(result.path, "events.jsonl")) as f:
        events = [json.loads(line) for line in f]
    assert [e["step"] for e in events if e["event"] == "resuming"] == [3]
    assert not list((tmp_path / "runs" / "ray" / "checkpoints").glob("tmp-*"))
    # The report draws the program's `train_loss` as the run's loss.
    page = (tmp_path / "runs" / "ray" / "report.html").read_text()
    assert 'class="series" data-name="train_loss"' in page
    # So do `meshrun ls` and the Result's metrics table.
    listed = subprocess.run([MESHRUN, "ls", "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, check=True).stdout
    assert listed.split("\n")[1].split()[4] == "0.1250", listed
    frame = result.metrics_dataframe
    assert list(frame[frame["attempt"] == 2]["step"]) == [4, 5, 6, 7]


def folders_from_both_ranks():
    import tempfile

    ctx = meshrun.get_context()
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "mine.txt"), "w") as f:
            f.write(f"rank {ctx.rank}")
        meshrun.report({"step": 0}, checkpoint=meshrun.Checkpoint.from_directory(folder))


@covers("py-checkpoint-directory-restore")
def test_folders_from_every_rank_are_kept_rank_0_at_the_top_others_under_rank_r(tmp_path):
    result = meshrun.Trainer(
        folders_from_both_ranks,
        scaling_config=meshrun.ScalingConfig(num_workers=2),
        run_config=meshrun.RunConfig(name="both", storage_path=str(tmp_path / "runs"), tee="none", progress=False),
    ).fit()
    with result.checkpoint.as_directory() as folder:
        for name, text in [("mine.txt", "rank 0"), ("rank-1/mine.txt", "rank 1")]:
            with open(os.path.join(folder, name)) as f:
                assert f.read() == text
    manifest = result.checkpoint.manifest()
    assert sorted(f["path"] for f in manifest["files"]) == ["mine.txt", "rank-1/mine.txt"]
    raises("py-checkpoint-directory-restore", lambda: meshrun.restore({"w": np.zeros(2)}, result.checkpoint))


def pytree_from_rank_0_alone():
    import jax.numpy as jnp

    ctx = meshrun.get_context()
    for step in range(3):
        state = {"w": jnp.ones(2) * step}  # every rank has it; only rank 0 passes it
        meshrun.report({"step": step}, checkpoint=state if ctx.rank == 0 else None)


@covers("py-checkpoint-pytree-on-some-ranks")
def test_a_pytree_passed_by_rank_0_alone_fails_the_run_naming_the_ranks(tmp_path):
    with pytest.raises(meshrun.TrainingFailedError) as info:
        meshrun.Trainer(
            pytree_from_rank_0_alone,
            scaling_config=meshrun.ScalingConfig(num_workers=2),
            run_config=meshrun.RunConfig(name="half", storage_path=str(tmp_path / "runs"), tee="none", progress=False),
        ).fit()
    says("py-checkpoint-pytree-on-some-ranks", str(info.value))
    assert info.value.result.checkpoint is None


def orbax_loop():
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    checkpoint = meshrun.get_checkpoint()
    if checkpoint is None:
        import tempfile

        state = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.float32(0.5)}
        with tempfile.TemporaryDirectory() as folder:
            with ocp.StandardCheckpointer() as saver:
                saver.save(os.path.join(folder, "state"), state)
            meshrun.report({"step": 0, "fresh": True}, checkpoint=meshrun.Checkpoint.from_directory(folder))
        raise RuntimeError("once")
    with checkpoint.as_directory() as folder:
        with ocp.StandardCheckpointer() as loader:
            state = loader.restore(os.path.join(folder, "state"))
    meshrun.report({"step": 1, "w": np.asarray(state["w"]).tolist(), "b": float(state["b"])})


def test_an_orbax_folder_is_kept_unchanged_and_restores(tmp_path):
    result = meshrun.Trainer(
        orbax_loop,
        run_config=meshrun.RunConfig(
            name="orbax", storage_path=str(tmp_path / "runs"), tee="none", progress=False,
            failure_config=meshrun.FailureConfig(max_failures=1),
        ),
    ).fit()  # fmt: skip
    assert result.metrics["w"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and result.metrics["b"] == 0.5, result.metrics


@covers("py-checkpoint-folder-missing", "py-checkpoint-folder-url", "py-checkpoint-folder-reserved-name", "py-report-committed-checkpoint", "py-report-ray-checkpoint")
def test_what_report_refuses_as_a_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raises("py-checkpoint-folder-missing", lambda: meshrun.Checkpoint.from_directory("out/ckpt"))
    raises("py-checkpoint-folder-url", lambda: meshrun.Checkpoint.from_directory("s3://bucket/ckpt"))
    committed = meshrun.Checkpoint(str(tmp_path / "runs/x/checkpoints/step-3"), 3)
    raises("py-report-committed-checkpoint", lambda: meshrun.report({"loss": 1.0}, checkpoint=committed))
    from ray.train import Checkpoint as RayCheckpoint

    raises("py-report-ray-checkpoint", lambda: meshrun.report({"loss": 1.0}, checkpoint=RayCheckpoint.from_directory(str(tmp_path))))
    # A folder whose top holds a name meshrun keeps beside rank 0's files:
    # refused before anything is copied.
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "manifest.json").write_text("{}")
    monkeypatch.setenv("MESHRUN_STORAGE_DIR", str(tmp_path / "storage"))
    raises("py-checkpoint-folder-reserved-name", lambda: meshrun.report({"step": 1}, checkpoint=meshrun.Checkpoint.from_directory(folder)))
    assert not (tmp_path / "storage" / "checkpoints" / "tmp-1").exists()


def nnx_state(seed: int, epoch: int):
    """Real training state: an NNX model whose state holds typed PRNG keys
    (its Dropout's) and int paths (an nnx.List), an optax state with
    hyperparameters injected, Python numbers and a None."""
    import flax.nnx as nnx
    import optax

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(2, 3, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)
            self.layers = nnx.List([nnx.Linear(3, 3, rngs=rngs) for _ in range(2)])

    module = Model(nnx.Rngs(seed))
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=0.1 * (seed + 1))
    opt = tx.init(nnx.state(module, nnx.Param))
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    # Keys sharded over the process's 2 devices, one row each.
    sharding = NamedSharding(jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,)), PartitionSpec("x"))
    keys = jax.device_put(jax.random.split(jax.random.key(seed), 2), sharding)
    return {"model": nnx.state(module), "opt": opt, "keys": keys, "epoch": epoch, "lr": 0.5 * seed, "nothing": None}


def digest(state) -> str:
    import hashlib

    import jax

    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", np.float32), jax.dtypes.prng_key):
            h.update(b"key" + np.asarray(jax.random.key_data(leaf)).tobytes())
        else:
            h.update(repr((jax.tree_util.keystr(path), type(leaf).__name__)).encode() + np.asarray(leaf).tobytes())
    return h.hexdigest()


def nnx_roundtrip():
    checkpoint = meshrun.get_checkpoint()
    if checkpoint is None:
        meshrun.report({"step": 0}, checkpoint=nnx_state(seed=1, epoch=3))
        raise RuntimeError("once, to restore in a fresh process")
    import jax

    target = nnx_state(seed=7, epoch=0)
    # A target may give a leaf's shape, dtype and sharding only.
    target["keys"] = jax.ShapeDtypeStruct(target["keys"].shape, target["keys"].dtype, sharding=target["keys"].sharding)
    restored = meshrun.restore(target, checkpoint)
    key = restored["model"]["drop"]["rngs"]["key"].value
    meshrun.report({"step": 1, "same": digest(restored) == digest(nnx_state(seed=1, epoch=3)), "key_dtype": str(key.dtype), "keys_sharding": str(restored["keys"].sharding.spec), "epoch": restored["epoch"], "epoch_type": type(restored["epoch"]).__name__, "lr_type": type(restored["lr"]).__name__})


def test_an_nnx_state_with_prng_keys_and_python_numbers_restores_bitwise(tmp_path):
    result = meshrun.Trainer(
        nnx_roundtrip,
        scaling_config=meshrun.ScalingConfig(num_workers=1, devices_per_worker=2),
        run_config=meshrun.RunConfig(
            name="nnx", storage_path=str(tmp_path / "runs"), tee="none", progress=False,
            failure_config=meshrun.FailureConfig(max_failures=1),
        ),
    ).fit()  # fmt: skip
    m = result.metrics
    assert m["same"] is True and m["key_dtype"] == "key<fry>" and m["keys_sharding"] == "P('x',)", m
    assert (m["epoch"], m["epoch_type"], m["lr_type"]) == (3, "int", "float"), m


@covers("py-save-unsupported-leaf")
def test_a_leaf_that_is_not_an_array_or_a_number_is_refused_naming_its_path(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHRUN_STORAGE_DIR", str(tmp_path / "storage"))
    raises("py-save-unsupported-leaf", lambda: meshrun.save(1, {"opt": {"schedule": "cosine"}, "w": np.zeros(2)}))


def env_fn():
    meshrun.report({"step": 0, "var": os.environ.get("FROM_RAY"), "mine": os.environ.get("MINE")})


def test_rays_own_config_objects_and_names_are_taken_for_what_they_say(tmp_path, capfd):
    import ray.train as rt

    result = meshrun.Trainer(
        env_fn,
        scaling_config=rt.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=rt.RunConfig(
            name="rayconf", storage_path=str(tmp_path / "runs"),
            worker_runtime_env={"env_vars": {"FROM_RAY": "yes", "MINE": "ray's"}},
            failure_config=rt.FailureConfig(max_failures=1),
            checkpoint_config=rt.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"),
        ),
    ).fit()  # fmt: skip
    assert result.metrics["var"] == "yes", result.metrics
    err = capfd.readouterr().err
    assert "took Ray's ray.train.ScalingConfig as ScalingConfig(num_workers=2" in err, err
    with open(os.path.join(result.path, "run.json")) as f:
        plan = json.load(f)["plan"]
    assert plan["nprocs"] == 2 and plan["failure"]["max_failures"] == 1, plan
    assert plan["retention"] == {"num_to_keep": 2, "keep_every_n_steps": None, "score_attribute": "loss", "score_order": "min"}, plan
    # meshrun's own RunConfig(env=) wins over worker_runtime_env.
    result = meshrun.Trainer(
        env_fn,
        run_config=meshrun.RunConfig(name="both", storage_path=str(tmp_path / "runs"), env={"MINE": "mine"}, worker_runtime_env={"env_vars": {"MINE": "ray's"}}),
    ).fit()
    assert result.metrics["mine"] == "mine", result.metrics


@covers("py-resources-unknown", "py-resources-fractional-gpu", "py-resources-too-many-cpus", "py-runtime-env-other-keys", "py-ray-max-failures-forever", "py-ray-scaling-meaningless")
def test_ray_names_that_cannot_mean_the_same_here_say_what_to_use(tmp_path):
    import ray.train as rt

    def fit(**kwargs):
        run = kwargs.pop("run_config", meshrun.RunConfig(storage_path=str(tmp_path / "runs")))
        return meshrun.Trainer(env_fn, run_config=run, **kwargs).fit()

    raises("py-resources-unknown", lambda: fit(scaling_config=meshrun.ScalingConfig(resources_per_worker={"TPU": 4})))
    raises("py-resources-fractional-gpu", lambda: fit(scaling_config=meshrun.ScalingConfig(resources_per_worker={"GPU": 0.5})))
    raises("py-resources-too-many-cpus", lambda: fit(scaling_config=meshrun.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 4096})))
    raises("py-runtime-env-other-keys", lambda: fit(run_config=meshrun.RunConfig(storage_path=str(tmp_path / "runs"), worker_runtime_env={"pip": ["requests"], "env_vars": {}})))
    raises("py-ray-max-failures-forever", lambda: fit(run_config=rt.RunConfig(storage_path=str(tmp_path / "runs"), failure_config=rt.FailureConfig(max_failures=-1))))
    raises("py-ray-scaling-meaningless", lambda: fit(scaling_config=rt.ScalingConfig(num_workers=1, accelerator_type="A100")))
    assert not (tmp_path / "runs").exists(), "refused before a run folder is made"
