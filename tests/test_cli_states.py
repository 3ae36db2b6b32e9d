"""What the run listing says about runs that did not end cleanly: a
controller killed mid-run, a damaged or renamed run folder; the rule for run
names on every command that takes one, and a name in use by a running
run; shell completion and a runs directory that is not there; `status` and
`logs` asked for a run, rank or attempt that is not there."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest
from conftest import HELLO, MESHRUN, SCRIPTS, alive, assert_none_left, cli, meshrun, read_jsonl, start, stop, wait_for
from errors_page import covers, exits, snapshot

NAME_RULE = "is not accepted: use 1 to 100 letters, digits, '.', '_' and '-', not starting with '.' or '-' and with no '..'"


def rows(ls_output: str) -> dict[str, list[str]]:
    """`meshrun ls` as name -> the row's other cells."""
    lines = ls_output.splitlines()
    assert lines and lines[0].split()[:2] == ["NAME", "STATE"], ls_output
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


def worker_pids(run_dir) -> list[int]:
    return [e["pid"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "worker_started"]


@pytest.mark.slow
def test_a_killed_controller_leaves_an_interrupted_run_that_can_be_continued(runs):
    run_dir = runs / "k"
    proc = start(["-n", "2", "--tee", "none", "-q", str(SCRIPTS / "plain_sleeper.py")], runs_dir=runs, name="k")
    pids: list[int] = []
    try:
        wait_for(lambda: proc.poll() is not None or all((run_dir / f"ready-{r}").exists() for r in (0, 1)), 60, "both workers to start")
        pids = worker_pids(run_dir)
        assert len(pids) == 2
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

        ls = cli("ls", "--runs-dir", runs)
        assert ls.returncode == 0, ls.stderr
        assert rows(ls.stdout)["k"][:2] == ["interrupted", "1"], ls.stdout
        status = cli("status", "k", "--runs-dir", runs)
        assert status.returncode == 0, status.stderr
        assert "state     interrupted" in status.stdout, status.stdout
        attempt_rows = [line.split() for line in status.stdout.splitlines() if line.strip().startswith("1 ")]
        assert attempt_rows and attempt_rows[0][1] == "interrupted", status.stdout
        assert "running" not in status.stdout, status.stdout
        # --follow ends instead of waiting for a controller that is gone.
        follow = subprocess.run([str(MESHRUN), "logs", "k", "--runs-dir", str(runs), "-f"], capture_output=True, text=True, timeout=20)
        assert follow.returncode == 0, follow.stderr

        # The same name continues the run, as after any other end.
        again = meshrun(["--tee", "none", "-q", str(SCRIPTS / "steady_reporter.py"), "3"], runs_dir=runs, name="k")
        assert again.code == 0, again.stderr
        assert rows(cli("ls", "--runs-dir", runs).stdout)["k"][:3] == ["succeeded", "2", "3"]
        status = cli("status", "k", "--runs-dir", runs).stdout
        states = [line.split()[1] for line in status.splitlines() if line.strip()[:2] in ("1 ", "2 ")]
        assert states == ["interrupted", "succeeded"], status
    finally:
        stop(proc)
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert_none_left(run_dir)


def test_run_names_follow_one_rule_on_every_command(runs):
    for bad in ["-x", "x..", "a..b"]:
        started = cli("run", "--runs-dir", runs, f"--name={bad}", SCRIPTS / "hello.py")
        assert started.returncode == 2, started.stderr
        assert f"run name '{bad}' {NAME_RULE}" in started.stderr
    assert not runs.exists(), "a refused name created the runs directory"
    runs.mkdir()
    for command in (["status"], ["logs"], ["report"], ["ckpt", "ls"]):
        refused = cli(*command, "--runs-dir", runs, "--", "-x")
        assert refused.returncode == 2, (command, refused.stderr)
        assert f"run name '-x' {NAME_RULE}" in refused.stderr, (command, refused.stderr)


def test_ls_shows_damaged_runs_and_names_runs_by_their_folder(runs):
    done = meshrun(["--tee", "none", "-q", str(SCRIPTS / "hello.py")], runs_dir=runs, name="orig")
    assert done.code == 0, done.stderr
    shutil.copytree(runs / "orig", runs / "copy")
    shutil.copytree(runs / "orig", runs / "broken")
    (runs / "broken" / "run.json").write_text('{"name": "orig", "state": ')
    (runs / "not-a-run").mkdir()

    ls = cli("ls", "--runs-dir", runs)
    assert ls.returncode == 0, ls.stderr
    listed = rows(ls.stdout)
    assert sorted(listed) == ["broken", "copy", "orig"], ls.stdout
    assert listed["copy"][0] == "succeeded"
    assert listed["broken"][0] == "damaged"

    copy = cli("status", "copy", "--runs-dir", runs)
    assert copy.returncode == 0, copy.stderr
    assert copy.stdout.startswith("run       copy\n"), copy.stdout
    broken = cli("status", "broken", "--runs-dir", runs)
    assert broken.returncode == 0, broken.stderr
    assert "state     damaged" in broken.stdout
    assert "run.json cannot be parsed: EOF while parsing a value at line 1 column 26" in broken.stdout, broken.stdout


def test_completion_scripts(tmp_path):
    bash = cli("completion", "bash")
    assert bash.returncode == 0, bash.stderr
    assert "complete -F _meshrun" in bash.stdout and "ckpt" in bash.stdout and "agent" not in bash.stdout
    script = tmp_path / "meshrun.bash"
    script.write_text(bash.stdout)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    for shell, marker in (("zsh", "#compdef meshrun"), ("fish", "complete -c meshrun")):
        out = cli("completion", shell)
        assert out.returncode == 0 and marker in out.stdout, (shell, out.stderr)


def test_ls_of_a_runs_directory_that_is_not_there(tmp_path):
    missing = tmp_path / "nothere"
    ls = cli("ls", "--runs-dir", missing)
    assert ls.returncode == 2
    assert f"runs directory '{missing}' does not exist" in ls.stderr, ls.stderr
    missing.mkdir()
    empty = cli("ls", "--runs-dir", missing)
    assert empty.returncode == 0 and empty.stdout == f"no runs in '{missing}'\n", empty.stdout


# Rows of docs/errors.md.

@covers("run-name-in-use")
def test_name_in_use_by_a_running_run(tmp_path):
    runs = tmp_path / "runs"
    first = start(["-n", "1", "--tee", "none", str(SCRIPTS / "plain_sleeper.py")], runs_dir=runs, name="busy")
    try:
        wait_for(lambda: first.poll() is not None or (runs / "busy" / "ready-0").exists(), 60, "the first run")
        # The running run writes its own memory samples whenever its
        # sleeper's memory moves (the first may be taken while the
        # interpreter still imports, a second after): they are not what
        # the second command could disturb, so they are left out.
        before = snapshot(runs / "busy")
        before.pop("memory.jsonl", None)
        proc = cli("run", "--runs-dir", runs, "--name", "busy", HELLO)
        exits("run-name-in-use", proc)
        assert f"(pid {first.pid})" in proc.stderr
        after = snapshot(runs / "busy")
        after.pop("memory.jsonl", None)
        assert after == before
        assert first.poll() is None, "the running run was disturbed"
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=30)
        stop(first)


@covers("status-no-such-run")
def test_status_of_a_run_that_is_not_there(finished_run):
    exits("status-no-such-run", cli("status", "nosuch", "--runs-dir", finished_run))


@covers("logs-no-such-rank", "logs-no-such-attempt")
def test_logs_of_a_rank_or_attempt_that_is_not_there(finished_run):
    before = snapshot(finished_run)
    exits("logs-no-such-rank", cli("logs", "two", "--rank", "7", "--runs-dir", finished_run))
    exits("logs-no-such-attempt", cli("logs", "two", "--attempt", "5", "--runs-dir", finished_run))
    assert snapshot(finished_run) == before


@pytest.mark.slow
def test_logs_of_a_rank_that_only_an_earlier_attempt_had(tmp_path):
    # Run 'lay' on 2 processes, then continued on 1: rank 1's log holds
    # attempt 1's output and is still shown.
    runs = tmp_path / "runs"
    for n in ("2", "1"):
        done = meshrun(["-n", n, "--tee", "none", HELLO], runs_dir=runs, name="lay")
        assert done.code == 0, done.stderr
    shown = cli("logs", "lay", "--rank", "1", "--attempt", "1", "--runs-dir", runs)
    assert shown.returncode == 0, shown.stderr
    assert "hello from rank 1" in shown.stdout, shown.stdout
    whole = cli("logs", "lay", "--rank", "1", "--runs-dir", runs)
    assert whole.returncode == 0 and "hello from rank 1" in whole.stdout, whole.stderr
    missing = cli("logs", "lay", "--rank", "2", "--runs-dir", runs)
    assert missing.returncode == 2 and "has no log for rank 2 (it has ranks 0 to 1)" in missing.stderr, missing.stderr
