"""The bad-input catalogue: one test per row of docs/errors.md, named by the
row's id. The expected message, exit status or exception come from the
table itself, so the page and the behaviour cannot drift apart; each test
also checks that nothing already written was lost or altered. The rows of
meshes and rules are tested in test_sharding.py: they start JAX in this
process, and the Ray tests' forks must come before that."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import MESHRUN, ROOT, SCRIPTS, assert_none_left, meshrun, start, stop, wait_for

import meshrun as mr
from meshrun import checkpoint, data

HELLO = str(SCRIPTS / "hello.py")
TABLE = ROOT / "docs" / "errors.md"


def read_catalogue() -> dict[str, tuple[str, str]]:
    """id -> (message, outcome) for every row of the page's tables."""
    rows = {}
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) != 4 or not re.fullmatch(r"[a-z][a-z0-9-]*", cells[0]) or cells[0] == "id":
            continue
        message = cells[2]
        assert message.startswith("`` ") and message.endswith(" ``"), f"row {cells[0]}: the message must be a ``code span``"
        assert cells[0] not in rows, f"row {cells[0]} appears twice"
        rows[cells[0]] = (message[3:-3].replace("\\|", "|"), cells[3])
    return rows


CATALOGUE = read_catalogue()
TESTED: set[str] = set()


def says(row: str, text: str) -> None:
    """``text`` holds the row's message: its parts between the '…' in order."""
    pos = 0
    for part in CATALOGUE[row][0].split("…"):
        found = text.find(part, pos)
        assert found >= 0, f"row {row}: expected {part!r} (after position {pos}) in:\n{text}"
        pos = found + len(part)


def exits(row: str, proc: subprocess.CompletedProcess | object) -> None:
    outcome = CATALOGUE[row][1]
    assert outcome.startswith("exit "), f"row {row} is not a command-line row"
    code = getattr(proc, "returncode", None)
    if code is None:
        code = proc.code
    assert code == int(outcome.split()[1]), f"row {row}: exit status {code}, expected {outcome}:\n{proc.stderr}"
    says(row, proc.stderr)


def raises(row: str, fn) -> None:
    kind = {"ConfigError": mr.ConfigError, "DataError": mr.DataError, "CheckpointError": mr.CheckpointError, "TypeError": TypeError}[CATALOGUE[row][1]]
    with pytest.raises(Exception) as caught:
        fn()
    assert type(caught.value) is kind, f"row {row}: raised {type(caught.value).__name__}: {caught.value}"
    says(row, str(caught.value))


def covers(*rows: str):
    TESTED.update(rows)
    return lambda f: f


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and a hash of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def cli(*args, cwd=ROOT, env=None):
    return subprocess.run([str(MESHRUN), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd, env={**os.environ, **(env or {})})


# ---------------------------------------------------------------- meshrun run

USAGE = {
    "run-nprocs-zero": ["-n", "0", HELLO],
    "run-nprocs-not-a-number": ["-n", "x", HELLO],
    "run-hosts-zero": ["--hosts", "0", HELLO],
    "run-hosts-do-not-divide": ["-n", "2", "--hosts", "3", HELLO],
    "run-too-many-hosts": ["-n", "300", "--hosts", "300", HELLO],
    "run-devices-zero": ["--devices-per-proc", "0", HELLO],
    "run-gpus-not-there": ["--gpus-per-proc", "1", HELLO],
    "run-gpus-on-cpu": ["--platform", "cpu", "--gpus-per-proc", "1", HELLO],
    "run-platform-unknown": ["--platform", "tpu9", HELLO],
    "run-tee-unknown": ["--tee", "some", HELLO],
    "run-no-program": [],
    "run-script-missing": ["missing_script.py"],
    "run-script-is-a-directory": [str(SCRIPTS)],
    "run-module-name-bad": ["-m", "not a module"],
    "run-name-with-slash": ["--name", "a/b", HELLO],
    "run-name-dot-dot": ["--name", "..", HELLO],
    "run-name-dot-dot-inside": ["--name", "x..", HELLO],
    "run-name-leading-dash": ["--name=-x", HELLO],
    "run-checkpoint-every-zero": ["--checkpoint-every", "0", HELLO],
    "run-keep-checkpoints-zero": ["--keep-checkpoints", "0", HELLO],
    "run-keep-every-zero": ["--keep-every-n-steps", "0", HELLO],
    "run-score-order-unknown": ["--checkpoint-score-order", "best", HELLO],
    "run-hang-timeout-zero": ["--hang-timeout", "0", HELLO],
    "run-hang-timeout-nan": ["--hang-timeout", "nan", HELLO],
    "run-max-failures-negative": ["--max-failures", "-1", HELLO],
    "run-ray-strategy-unknown": ["--ray", "auto", "--ray-strategy", "FOO", HELLO],
    "run-control-host-not-an-ip": ["--control-host", "nothost", HELLO],
    # 192.0.2.0/24 is reserved for documentation: never this machine's.
    "run-control-host-elsewhere": ["--control-host", "192.0.2.1", HELLO],
}
covers(*USAGE)


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("errors") / "runs"
    done = meshrun(["-n", "2", "--tee", "none", HELLO], runs_dir=runs, name="two")
    assert done.code == 0, done.stderr
    return runs


@pytest.mark.parametrize("row", sorted(USAGE))
def test_usage_errors_of_run(row, earlier_run):
    before = snapshot(earlier_run)
    proc = cli("run", "--runs-dir", earlier_run, *USAGE[row], env={"CUDA_VISIBLE_DEVICES": ""})
    exits(row, proc)
    assert snapshot(earlier_run) == before, "the runs directory was changed"


@covers("run-control-port-in-use")
def test_control_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("run", "--runs-dir", tmp_path / "runs", "--control-port", port, HELLO)
        exits("run-control-port-in-use", proc)
        assert f"--control-port {port} on 127.0.0.1 is in use" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_free_control_port_is_used_by_every_attempt(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = meshrun(["-n", "2", "--tee", "none", "--control-port", str(port), "--max-failures", "1", str(SCRIPTS / "fail_once.py")], runs_dir=tmp_path / "runs")
    assert done.code == 0, done.stderr
    bound = [e["control_addr"] for e in done.events() if e["event"] == "attempt_started"]
    assert bound == [f"127.0.0.1:{port}"] * 2


@covers("run-runs-dir-is-a-file")
def test_runs_dir_below_a_file(tmp_path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    exits("run-runs-dir-is-a-file", cli("run", "--runs-dir", blocker / "runs", HELLO))
    assert blocker.read_text() == "keep me"


@covers("run-runs-dir-read-only")
def test_runs_dir_on_a_read_only_file_system():
    # Root ignores permission bits; procfs refuses everyone.
    exits("run-runs-dir-read-only", cli("run", "--runs-dir", "/proc/meshrun-runs", HELLO))


@covers("run-runs-dir-full")
def test_runs_dir_on_a_full_file_system(tmp_path):
    # A small tmpfs of its own, in a private mount namespace, filled up.
    full = tmp_path / "full"
    full.mkdir()
    script = f"""set -e
mount -t tmpfs -o size=64k tmpfs {full}
mkdir {full}/runs && echo kept > {full}/runs/notes.txt
head -c 1M /dev/zero > {full}/filler 2>/dev/null || true
{MESHRUN} run --runs-dir {full}/runs {HELLO} && exit 99 || status=$?
test "$(cat {full}/runs/notes.txt)" = kept && test "$(ls {full}/runs)" = notes.txt || exit 98
exit $status
"""
    proc = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode not in (98, 99), f"the run started, or the runs directory changed: {proc.stderr}"
    exits("run-runs-dir-full", proc)


@covers("run-runs-dir-fills-up")
def test_runs_dir_that_fills_up_during_the_run(tmp_path):
    full, kept = tmp_path / "full", tmp_path / "kept"
    full.mkdir()
    script = f"""mount -t tmpfs -o size=256k tmpfs {full} || exit 97
{MESHRUN} run -q --runs-dir {full}/runs --name f {SCRIPTS / "fill_disk.py"}
status=$?
cp -r {full}/runs/f {kept}
exit $status
"""
    proc = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    exits("run-runs-dir-fills-up", proc)
    assert_none_left(kept)
    # What was written before the disk filled up is whole: the record of
    # the run, every event, every metric but a last line cut short.
    assert json.loads((kept / "run.json").read_text())["name"] == "f"
    assert not list(kept.glob(".*.tmp")), "a half-written copy was left behind"
    assert [json.loads(line)["event"] for line in (kept / "events.jsonl").read_text().splitlines()][-1] == "run_ended"
    metrics = (kept / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics[:-1]] == list(range(len(metrics) - 1))


@covers("run-name-in-use")
def test_name_in_use_by_a_running_run(tmp_path):
    runs = tmp_path / "runs"
    first = start(["-n", "1", "--tee", "none", str(SCRIPTS / "plain_sleeper.py")], runs_dir=runs, name="busy")
    try:
        wait_for(lambda: first.poll() is not None or (runs / "busy" / "ready-0").exists(), 60, "the first run")
        before = snapshot(runs / "busy")
        proc = cli("run", "--runs-dir", runs, "--name", "busy", HELLO)
        exits("run-name-in-use", proc)
        assert f"(pid {first.pid})" in proc.stderr
        assert snapshot(runs / "busy") == before
        assert first.poll() is None, "the running run was disturbed"
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=30)
        stop(first)


@covers("run-ray-unreachable")
def test_ray_address_that_does_not_answer(tmp_path):
    t0 = time.monotonic()
    proc = cli("run", "--runs-dir", tmp_path / "runs", "--ray", "127.0.0.1:9", "--control-host", "127.0.0.1", "--platform", "cpu", HELLO)
    exits("run-ray-unreachable", proc)
    assert time.monotonic() - t0 < 30


@covers("run-worker-fails")
def test_a_failed_worker_keeps_its_logs_and_metrics(tmp_path):
    # A JAX program, as users' are: its exit is reported before JAX's
    # shutdown barrier can hold it (minutes, then SIGABRT).
    done = meshrun(["-n", "2", "-q", str(SCRIPTS / "jax_exit_code.py")], runs_dir=tmp_path / "runs", name="fails", timeout=60)
    exits("run-worker-fails", done)
    assert "rank 1 giving up" in done.log(1)
    assert (done.run_dir / "run.json").exists() and (done.run_dir / "events.jsonl").exists()


# ------------------------------------------------ ls, status, logs, ckpt

@covers("status-no-such-run")
def test_status_of_a_run_that_is_not_there(earlier_run):
    exits("status-no-such-run", cli("status", "nosuch", "--runs-dir", earlier_run))


@covers("logs-no-such-rank", "logs-no-such-attempt")
def test_logs_of_a_rank_or_attempt_that_is_not_there(earlier_run):
    before = snapshot(earlier_run)
    exits("logs-no-such-rank", cli("logs", "two", "--rank", "7", "--runs-dir", earlier_run))
    exits("logs-no-such-attempt", cli("logs", "two", "--attempt", "5", "--runs-dir", earlier_run))
    assert snapshot(earlier_run) == before


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A committed checkpoint whose leaf 'w' is split over two ranks' files."""
    runs = tmp_path_factory.mktemp("errors-ckpt") / "runs"
    done = meshrun(["-n", "2", "--tee", "none", str(SCRIPTS / "save_split.py")], runs_dir=runs, name="ck")
    assert done.code == 0, done.stderr
    path = done.run_dir / "checkpoints" / "step-3"
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "rank-0.safetensors", "rank-1.safetensors"]
    return path


@pytest.fixture
def ckpt(saved, tmp_path):
    copy = tmp_path / "step-3"
    shutil.copytree(saved, copy)
    return copy


TARGET = {"w": np.zeros((8, 4), np.float32), "b": np.zeros((4,), np.float32)}


def flip_a_byte(shard: Path) -> None:
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0x01  # inside the last tensor's data
    shard.write_bytes(bytes(raw))


@covers("ckpt-not-a-checkpoint", "ckpt-verify-corrupt")
def test_ckpt_verify_of_a_folder_and_of_a_corrupt_checkpoint(ckpt, tmp_path):
    exits("ckpt-not-a-checkpoint", cli("ckpt", "verify", tmp_path))
    flip_a_byte(ckpt / "rank-0.safetensors")
    before = snapshot(ckpt)
    exits("ckpt-verify-corrupt", cli("ckpt", "verify", ckpt))
    assert snapshot(ckpt) == before


def restore_fails(row: str, path: Path, target=TARGET) -> None:
    before = snapshot(path)
    raises(row, lambda: checkpoint.restore(target, path))
    assert snapshot(path) == before, "restoring changed the checkpoint"


@covers("ckpt-missing-shard")
def test_restore_with_a_shard_missing(ckpt):
    (ckpt / "rank-1.safetensors").unlink()
    restore_fails("ckpt-missing-shard", ckpt)


@covers("ckpt-bad-crc")
def test_restore_with_a_flipped_byte(ckpt):
    flip_a_byte(ckpt / "rank-0.safetensors")
    restore_fails("ckpt-bad-crc", ckpt)


@covers("ckpt-shard-truncated")
def test_restore_with_a_shard_cut_short(ckpt):
    shard = ckpt / "rank-0.safetensors"
    shard.write_bytes(shard.read_bytes()[:40])
    restore_fails("ckpt-shard-truncated", ckpt)


@covers("ckpt-shape-mismatch", "ckpt-dtype-mismatch", "ckpt-leaf-missing")
def test_restore_onto_a_tree_that_does_not_match(ckpt):
    restore_fails("ckpt-shape-mismatch", ckpt, {**TARGET, "w": np.zeros((8, 8), np.float32)})
    restore_fails("ckpt-dtype-mismatch", ckpt, {**TARGET, "w": np.zeros((8, 4), np.float64)})
    restore_fails("ckpt-leaf-missing", ckpt, {**TARGET, "v": np.zeros(2, np.float32)})
    restored = checkpoint.restore(TARGET, ckpt)
    np.testing.assert_array_equal(restored["w"], np.arange(32, dtype=np.float32).reshape(8, 4))


@covers("ckpt-manifest-damaged")
def test_restore_with_a_damaged_manifest(ckpt):
    (ckpt / "manifest.json").write_text("{not json")
    restore_fails("ckpt-manifest-damaged", ckpt)


@covers("ckpt-not-committed")
def test_restore_of_a_folder_that_is_not_a_checkpoint(tmp_path):
    restore_fails("ckpt-not-committed", tmp_path)


# -------------------------------------------------------- Python configs

def fit(tmp_path, fn=lambda: None, **kwargs):
    runs = tmp_path / "runs"
    mr.Trainer(fn, run_config=mr.RunConfig(storage_path=str(runs), **kwargs.pop("run", {})), **kwargs).fit()


PY_CONFIGS = {
    "py-num-workers-zero": dict(scaling_config=mr.ScalingConfig(num_workers=0)),
    "py-backend-unknown": dict(scaling_config=mr.ScalingConfig(backend="kube")),
    "py-ray-without-address": dict(scaling_config=mr.ScalingConfig(backend="ray")),
    "py-control-port-out-of-range": dict(scaling_config=mr.ScalingConfig(control_port=70000)),
    "py-hang-timeout-not-a-number": dict(run={"failure_config": mr.FailureConfig(hang_timeout_s="10s")}),
    "py-score-order-unknown": dict(run={"checkpoint_config": mr.CheckpointConfig(score_order="best")}),
}
covers(*PY_CONFIGS)


@pytest.mark.parametrize("row", sorted(PY_CONFIGS))
def test_python_config_errors(row, tmp_path):
    raises(row, lambda: fit(tmp_path, **PY_CONFIGS[row]))
    assert not (tmp_path / "runs").exists()


@covers("py-train-fn-not-callable")
def test_train_fn_that_is_not_callable():
    raises("py-train-fn-not-callable", lambda: mr.Trainer(42))


@covers("py-train-fn-unpicklable")
def test_train_fn_that_cannot_be_pickled(tmp_path):
    lock = threading.Lock()

    def uses_lock():
        with lock:
            pass

    raises("py-train-fn-unpicklable", lambda: fit(tmp_path, uses_lock))
    assert not (tmp_path / "runs").exists()


@covers("py-report-not-a-dict", "py-report-checkpoint-without-step", "py-report-total-steps-negative")
def test_report_arguments():
    raises("py-report-not-a-dict", lambda: mr.report([1]))
    raises("py-report-checkpoint-without-step", lambda: mr.report({"loss": 1.0}, checkpoint={"w": np.zeros(2)}))
    raises("py-report-total-steps-negative", lambda: mr.report({"loss": 1.0}, total_steps=-1))


@covers("py-save-outside-a-run")
def test_save_outside_a_run(monkeypatch):
    monkeypatch.delenv("MESHRUN_RUN_DIR", raising=False)
    raises("py-save-outside-a-run", lambda: mr.save(1, {"w": np.zeros(2)}))


# ------------------------------------------------------------------- data

@pytest.fixture
def files(tmp_path):
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "ok.bin")
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 1001)
    (tmp_path / "bad.npy").write_bytes(b"not an array")
    np.save(tmp_path / "complex.npy", np.zeros((8, 2), np.complex64))
    pq.write_table(pa.table({"text": ["a", "b"] * 10}), tmp_path / "text.parquet")
    (tmp_path / "cut.parquet").write_bytes((tmp_path / "text.parquet").read_bytes()[:50])
    (tmp_path / "shards").mkdir()
    # A damaged data page inside the fourth row group: the footer still reads.
    ids = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 3]] * 1000, type=pa.list_(pa.int32()))}), ids, row_group_size=100, compression="snappy")
    start = pq.ParquetFile(ids).metadata.row_group(3).column(0).data_page_offset
    damaged = bytearray(ids.read_bytes())
    damaged[start + 10 : start + 40] = b"\xff" * 30
    (tmp_path / "damaged.parquet").write_bytes(bytes(damaged))
    return tmp_path


def data_fails(row: str, files: Path, fn) -> None:
    before = snapshot(files)
    raises(row, fn)
    assert snapshot(files) == before, "reading changed the data files"


@covers(
    "data-file-missing",
    "data-no-files-match",
    "data-tokens-truncated",
    "data-dtype-unsupported",
    "data-too-short",
    "data-seq-len-zero",
    "data-parquet-corrupt",
    "data-parquet-no-column",
    "data-parquet-wrong-type",
    "data-parquet-damaged-page",
    "data-npy-corrupt",
    "data-npy-wrong-dtype",
)
def test_data_files_that_cannot_be_read(files):
    data_fails("data-file-missing", files, lambda: data.tokens(files / "nope.bin", "uint16", 8))
    data_fails("data-no-files-match", files, lambda: data.parquet(str(files / "shards" / "*.parquet"), ["tokens"], seq_len=4))
    data_fails("data-tokens-truncated", files, lambda: data.tokens(files / "odd.bin", "uint16", 8))
    data_fails("data-dtype-unsupported", files, lambda: data.tokens(files / "ok.bin", "float32", 8))
    data_fails("data-too-short", files, lambda: data.tokens(files / "ok.bin", "uint16", 200))
    data_fails("data-seq-len-zero", files, lambda: data.tokens(files / "ok.bin", "uint16", 0))
    data_fails("data-parquet-corrupt", files, lambda: data.parquet(files / "cut.parquet", ["text"], seq_len=4))
    data_fails("data-parquet-no-column", files, lambda: data.parquet(files / "text.parquet", ["tokens"], seq_len=4))
    data_fails("data-parquet-wrong-type", files, lambda: data.parquet(files / "text.parquet", ["text"], seq_len=4))
    data_fails("data-parquet-damaged-page", files, lambda: data.parquet(files / "damaged.parquet", ["tokens"], seq_len=4))
    data_fails("data-npy-corrupt", files, lambda: data.npy(files / "bad.npy"))
    data_fails("data-npy-wrong-dtype", files, lambda: data.npy(files / "complex.npy"))


@covers("data-batch-not-divisible", "data-batch-larger-than-data", "data-batch-negative", "data-resume-other-data-set", "data-resume-other-seed")
def test_loader_settings_that_do_not_fit(files):
    source = data.tokens(files / "ok.bin", "uint16", 8)  # 12 windows
    raises("data-batch-not-divisible", lambda: data.Loader(source, 10, rank=0, num_processes=4))
    raises("data-batch-larger-than-data", lambda: data.Loader(source, 64, rank=0, num_processes=1))
    raises("data-batch-negative", lambda: data.Loader(source, -8, rank=0, num_processes=1))
    loader = data.Loader(source, 4, rank=0, num_processes=1)
    next(iter(loader))
    state = loader.state()
    np.arange(100, dtype=np.uint16)[::-1].copy().tofile(files / "other.bin")
    raises("data-resume-other-data-set", lambda: data.Loader(data.tokens(files / "other.bin", "uint16", 8), 4, state=state, rank=0, num_processes=1))
    raises("data-resume-other-seed", lambda: data.Loader(source, 4, state=state, seed=1, rank=0, num_processes=1))


# ------------------------------------------------------------- the page

def test_every_row_has_a_test_and_every_test_a_row():
    import test_sharding  # noqa: F401  (the mesh and rule rows register on import)

    assert len(CATALOGUE) >= 40
    assert sorted(set(CATALOGUE) - TESTED) == [], "rows without a test"
    assert sorted(TESTED - set(CATALOGUE)) == [], "tests of rows the page does not have"


# ------------------------------------------------ resuming from a given step

@covers("run-resume-from-missing-step", "run-resume-from-no-checkpoints", "py-resume-from-missing-step")
def test_resume_from_a_step_that_is_not_there(saved, earlier_run):
    runs = saved.parents[2]
    before, before_two = snapshot(runs), snapshot(earlier_run)
    exits("run-resume-from-missing-step", cli("run", "--runs-dir", runs, "--name", "ck", "--resume-from", "999", HELLO))
    exits("run-resume-from-no-checkpoints", cli("run", "--runs-dir", earlier_run, "--name", "two", "--resume-from", "1", HELLO))
    raises("py-resume-from-missing-step", lambda: mr.Trainer(lambda: None, run_config=mr.RunConfig(name="ck", storage_path=str(runs), resume_from=999)).fit())
    assert snapshot(runs) == before and snapshot(earlier_run) == before_two, "a refused resume changed a run"


@covers("run-resume-from-damaged")
def test_resume_from_a_step_that_does_not_verify(saved, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(saved.parents[1], runs / "ck")
    flip_a_byte(runs / "ck" / "checkpoints" / "step-3" / "rank-0.safetensors")
    before = snapshot(runs)
    exits("run-resume-from-damaged", cli("run", "--runs-dir", runs, "--name", "ck", "--resume-from", "3", HELLO))
    assert snapshot(runs) == before, "the refused run changed the run or its checkpoint"


@covers("py-resume-from-negative")
def test_resume_from_a_negative_step(tmp_path):
    raises("py-resume-from-negative", lambda: fit(tmp_path, run={"resume_from": -1}))
    assert not (tmp_path / "runs").exists()
