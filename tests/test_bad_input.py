"""Every mistake on the command line gets a clear message naming the value
and what is accepted, exit status 2, and no run directory left behind."""

from __future__ import annotations

import subprocess

import pytest
from conftest import MESHRUN, ROOT, SCRIPTS

HELLO = str(SCRIPTS / "hello.py")


def run_cli(args, runs):
    return subprocess.run([str(MESHRUN), "run", "--runs-dir", str(runs), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["-n", "0", HELLO], "-n/--nprocs must be at least 1, got 0"),
        (["--hosts", "3", "-n", "2", HELLO], "--hosts 3 does not divide -n 2"),
        (["--hosts", "0", HELLO], "--hosts must be at least 1, got 0"),
        (["-n", "2", "missing_script.py"], "script 'missing_script.py' not found"),
        (["-n", "1", str(SCRIPTS)], "is a directory, not a Python file"),
        (["--devices-per-proc", "0", HELLO], "--devices-per-proc must be at least 1, got 0"),
        (["--gpus-per-proc", "1", HELLO], "need 1 GPUs on host 0, but 0 are available"),
        (["--platform", "cpu", "--gpus-per-proc", "1", HELLO], "--gpus-per-proc 1 needs --platform cuda or auto"),
        (["--platform", "tpu9", HELLO], "invalid value 'tpu9' for '--platform"),
        (["--name", "a/b", HELLO], "run name 'a/b' is not accepted"),
        (["--name", "..", HELLO], "run name '..' is not accepted"),
        (["-n", "x", HELLO], "invalid value 'x' for '--nprocs"),
        (["-m", "not a module"], "module name 'not a module' is not a dotted Python module name"),
        (["--checkpoint-every", "0", HELLO], "--checkpoint-every must be at least 1 step, got 0"),
        (["--hang-timeout", "0", HELLO], "--hang-timeout must be a positive number of seconds, got 0"),
        (["--hang-timeout", "nan", HELLO], "--hang-timeout must be a positive number of seconds, got NaN"),
        (["--max-failures", "-1", HELLO], "invalid value '-1' for '--max-failures <N>'"),
    ],
)
def test_bad_input(tmp_path, args, expected):
    runs = tmp_path / "runs"
    env_clean = {"CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [str(MESHRUN), "run", "--runs-dir", str(runs), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**__import__("os").environ, **env_clean},
    )
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert not runs.exists(), "a run directory was left behind"


def test_unknown_platform_lists_accepted_values(tmp_path):
    proc = run_cli(["--platform", "tpu9", HELLO], tmp_path / "runs")
    assert "possible values: cpu, cuda, auto" in proc.stderr


def test_unwritable_runs_dir(tmp_path):
    # Root ignores permission bits, so use places nobody can write: a path
    # below a regular file, and procfs.
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_cli([HELLO], blocker / "runs")
    assert proc.returncode == 2
    assert f"runs directory '{blocker / 'runs'}' cannot be used" in proc.stderr
    assert "is not a directory" in proc.stderr
    proc = run_cli([HELLO], "/proc/meshrun-runs")
    assert proc.returncode == 2
    assert "runs directory '/proc/meshrun-runs' cannot be used" in proc.stderr
    assert blocker.read_text() == "x"
