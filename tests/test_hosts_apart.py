"""Hosts that share nothing (own address, own /tmp, own scratch; see
nshosts.py): the storage every host must see, hosts that join by
themselves (`meshrun join`), and function mode with nothing left behind."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import GPT_TINY, MESHRUN, ROOT, SCRIPTS, cli, freeze_agent_and_kill_worker, read_jsonl, wait_for
from errors_page import covers, exits
from hostsrun import listen_addr, meshrun_on, run_args, start_joins

PACED = str(SCRIPTS / "gpt_paced.py")
SLEEPER = str(SCRIPTS / "plain_sleeper.py")
HELLO = str(SCRIPTS / "hello.py")


def token_env() -> dict:
    return {"MESHRUN_TOKEN": secrets.token_hex(32)}


@covers("run-storage-not-shared")
def test_a_storage_path_a_host_cannot_see_is_refused_before_any_worker_starts(nshosts):
    hosts = nshosts(2, without_shared=[1])
    t0 = time.monotonic()
    done = meshrun_on(hosts, ["-n", "2", "--join-timeout", "30", HELLO])
    exits("run-storage-not-shared", done)
    assert time.monotonic() - t0 < 20, "refused within seconds"
    assert f"host 1 ({hosts.addr(1)}) cannot see the run's storage '{hosts.shared}'" in done.stderr, done.stderr
    assert "shared filesystem" in done.stderr and "object storage" in done.stderr
    assert not [e for e in done.events() if e["event"] == "worker_started"]
    # The marker is gone; nothing of the run is left in the storage but its folder.
    assert not list(done.storage_dir.glob(".meshrun-storage-check-*"))


def _hosts_by_ip(run_dir) -> dict[str, int]:
    return {e["ip"]: e["host"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "agent_joined"}


@pytest.mark.slow
def test_hosts_get_ranks_in_join_order_or_the_one_they_name(nshosts):
    hosts = nshosts(4)
    env = token_env()
    controller = hosts.popen(0, run_args(hosts, ["-n", "4", "--join-timeout", "60", HELLO], "order"), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    join = lambda h, *extra, env=env: hosts.popen(h, [str(MESHRUN), "join", listen_addr(hosts), *extra], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # noqa: E731
    run_dir = hosts.tmp(0) / "runs" / "order"
    joined = lambda n: len(_hosts_by_ip(run_dir)) >= n  # noqa: E731
    # Host 3 asks for rank 1 under Slurm; host 2 names rank 3; host 1 takes
    # what is left (rank 2) though it joined last.
    first = join(3, env={**env, "SLURM_NODEID": "1"})
    wait_for(lambda: joined(2), 30, "the Slurm host")
    second = join(2, "--host-rank", "3")
    wait_for(lambda: joined(3), 30, "the host naming its rank")
    third = join(1)
    out, err = controller.communicate(timeout=120)
    assert controller.returncode == 0, err
    for p in (first, second, third):
        assert p.wait(timeout=30) == 0, p.stdout.read()
    assert _hosts_by_ip(run_dir) == {hosts.addr(0): 0, hosts.addr(3): 1, hosts.addr(2): 3, hosts.addr(1): 2}
    # Ranks follow the hosts: rank 2 (host 1's worker) said hello from host 1.
    log = (run_dir / "logs" / "rank-2.log").read_text()
    assert "hello from rank 2" in log


@pytest.mark.slow
@covers("join-wrong-token", "join-host-rank-out-of-range", "join-run-is-full")
def test_a_wrong_token_a_rank_out_of_range_and_a_third_host_are_refused(nshosts):
    hosts = nshosts(4)
    env = token_env()
    controller = hosts.popen(0, run_args(hosts, ["-n", "2", "--join-timeout", "60", SLEEPER], "refusals", count=2), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        join = lambda h, *extra, env=env: hosts.run(h, [str(MESHRUN), "join", listen_addr(hosts), "--join-timeout", "20", *extra], env=env, cwd=ROOT, check=False, timeout=60)  # noqa: E731
        wrong = join(1, env=token_env())
        exits("join-wrong-token", wrong)
        assert f"the controller at {listen_addr(hosts)} did not accept this host's run token" in wrong.stderr, wrong.stderr
        exits("join-host-rank-out-of-range", join(2, "--host-rank", "2"))
        member = hosts.popen(1, [str(MESHRUN), "join", listen_addr(hosts)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = hosts.shared / "refusals" / "ready-1"
        wait_for(ready.exists, 60, "the run to start on its two hosts")
        exits("join-run-is-full", join(3))
        refused = [e for e in read_jsonl(hosts.tmp(0) / "runs" / "refusals" / "events.jsonl") if e["event"] == "agent_refused"]
        assert [e["ip"] for e in refused] == [hosts.addr(2), hosts.addr(3)]
    finally:
        controller.send_signal(2)
        controller.communicate(timeout=30)
    # The run was interrupted, not finished: its host says so, and exits 1
    # as for any run that did not succeed.
    said = member.communicate(timeout=30)[0]
    assert member.returncode == 1 and "meshrun join: run 'refusals' ended: interrupted" in said, said


@pytest.mark.slow
@covers("run-hosts-never-join")
def test_a_host_that_never_joins_ends_the_run_naming_it(nshosts):
    hosts = nshosts(3)
    # The run alone: nobody joins.
    proc = hosts.run(0, run_args(hosts, ["-n", "3", "--join-timeout", "3", HELLO], "alone"), env=token_env(), cwd=ROOT, check=False, timeout=60)
    exits("run-hosts-never-join", proc)
    assert "meshrun join " + listen_addr(hosts) in proc.stderr, "the join command is printed"


@pytest.mark.own_compile_cache  # it checks that the cache, too, stays in the scratch folder
def test_function_mode_on_two_hosts_writes_nothing_outside_scratch_and_storage(nshosts):
    hosts = nshosts(2)
    env = token_env()
    fit = hosts.popen(0, [sys.executable, str(SCRIPTS / "fit_on_hosts.py"), listen_addr(hosts), str(hosts.shared)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (joiner,) = start_joins(hosts, env)
    out, err = fit.communicate(timeout=240)
    assert fit.returncode == 0, err
    assert joiner.wait(timeout=30) == 0, joiner.stdout.read()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["error"] is None, result
    assert result["metrics"]["sum"] == 3 and result["metrics"]["devices"] == 2
    # The run folder is in the storage (RunConfig.storage_path); each host
    # kept only its compilation cache in its scratch folder, and nothing in
    # its /tmp.
    assert (hosts.shared / "fit" / "run.json").exists()
    for h in range(2):
        assert hosts.written_to_tmp(h) == [], f"host {h} wrote to its /tmp"
        assert sorted(p.name for p in hosts.scratch(h).iterdir()) == ["compile-cache", "runs"]
        assert list((hosts.scratch(h) / "runs").iterdir()) == [], f"host {h} kept the run's scratch"


EXAMPLE = str(ROOT / "examples" / "gpt.py")


@pytest.mark.slow
def test_a_host_cut_off_mid_training_rejoins_and_the_run_ends_bit_identical(nshosts, gpt_data, gpt_reference):
    """The GPT on 2 hosts x 1 process x 2 devices (fsdp 2 x tensor 2),
    checkpoints in the storage both hosts see; host 1's link is cut for
    15 s right after the first commit, 5 s past the heartbeat window. The
    attempt fails naming host 1 and its address, and that is the run's one
    failure (`--max-failures 1`): the restart waits for host 1 to rejoin,
    host 1 ends its old attempt's workers and connection before it starts
    the new ones, both hosts start warm (host 1's agent, with no cgroups,
    is its workers' subreaper and still keeps its spares), the run resumes
    from the newest checkpoint, and the final parameters equal those of an
    uninterrupted run on one host. `make partition` runs it at full length."""
    # 30 steps: those of the restart tests' shared reference.
    steps = int(os.environ.get("MESHRUN_PARTITION_STEPS", "30"))
    model = [*GPT_TINY] if steps < 100 else ["--fsdp", "2", "--tensor", "2"]
    train = [EXAMPLE, *model, "--steps", str(steps)]
    launch = ["-n", "2", "--devices-per-proc", "2", "--tee", "none", "--checkpoint-every", "2"]

    hosts = nshosts(2)
    env = token_env()
    # The data set sits in the storage both hosts see.
    shutil.copytree(gpt_data, hosts.shared / "data")
    train += ["--data-dir", str(hosts.shared / "data")]
    args = run_args(hosts, [*launch, "--max-failures", "1", "--join-timeout", "120", *train, "--params-digest", str(hosts.shared / "cut.sha")], "cut")
    controller = hosts.popen(0, args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (joiner,) = start_joins(hosts, {**env, "MESHRUN_CGROUP": "0"}, timeout=120)
    run_dir = hosts.tmp(0) / "runs" / "cut"
    events = lambda kind: [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]  # noqa: E731
    wait_for(lambda: controller.poll() is not None or events("checkpoint_committed"), 300, "the first commit")
    assert controller.poll() is None, controller.communicate()[1]
    # The spares start once every rank has trained a step: under load that
    # can be seconds after the first commit.
    wait_for(lambda: controller.poll() is not None or (hosts.spares(0) and hosts.spares(1)), 120, "the warm spares of both hosts")
    assert controller.poll() is None, controller.communicate()[1]
    hosts.cut(1)
    cut_at = time.time()
    time.sleep(15)
    hosts.restore(1)
    out, err = controller.communicate(timeout=900)
    if controller.returncode != 0:
        # What host 1's agent and the run's events saw, to tell a host that
        # never noticed the cut from one that was refused or never called.
        joiner.kill()
        said = joiner.communicate(timeout=30)[0]
        seen = (run_dir / "events.jsonl").read_text()[-6000:] if (run_dir / "events.jsonl").exists() else "(no events)"
        pytest.fail(f"{err}\n--- host 1's `meshrun join`:\n{said}\n--- events:\n{seen}")
    assert joiner.wait(timeout=60) == 0, joiner.stdout.read()
    said = joiner.stdout.read()
    # The cut is said as a sentence (no `host=Some(1)`), then the rejoin.
    assert "meshrun join: lost the connection to the controller at" in said and "host=Some(" not in said, said
    assert "meshrun join: attempt 2: started rank 1 on this host" in said and said.rstrip().endswith("meshrun join: run 'cut' ended: succeeded"), said

    failed = events("worker_failed")
    assert len(failed) == 1, failed
    cause = failed[0]["cause"]
    assert cause["kind"] == "host_unreachable" and cause["host"] == 1 and cause["ip"] == hosts.addr(1), cause
    assert 9 <= failed[0]["time"] - cut_at <= 16, "failed within the heartbeat window"
    assert f"host 1 ({hosts.addr(1)}), unreachable for" in err
    restarted = events("restarting")
    assert len(restarted) == 1 and restarted[0]["from_step"] is not None
    rejoined = [e for e in events("agent_joined") if e["host"] == 1]
    assert len(rejoined) == 2 and rejoined[1]["ip"] == hosts.addr(1)
    warm = {e["rank"]: e.get("warm", False) for e in events("worker_started") if e["attempt"] == 2}
    assert warm == {0: True, 1: True}, f"the restart did not go to the spares: {warm}"
    # A spare is not a leftover: none that went on to train was ended as one.
    adopted = {e["pid"] for e in events("worker_started") if e["attempt"] == 2}
    ended = [e for e in events("leftovers_ended") if adopted & set(e["pids"])]
    assert not ended, f"spares were ended as leftovers: {ended}"
    assert (hosts.shared / "cut.sha").read_text() == gpt_reference(*model, "--steps", str(steps)).digest
    # The run's checkpoints are in the storage, and the CLI finds them there.
    listed = cli("ckpt", "ls", "cut", "--runs-dir", run_dir.parent)
    assert listed.returncode == 0 and str(hosts.shared / "cut" / "checkpoints" / "step-") in listed.stdout, listed.stdout
    assert not (run_dir / "checkpoints").exists() or not list((run_dir / "checkpoints").iterdir())


@pytest.mark.slow
def test_a_host_that_never_comes_back_ends_the_run_saying_so(nshosts):
    """Host 1 cut off for good: the attempt fails, the restart waits the
    join timeout for it, and the run ends with status 1 naming it."""
    hosts = nshosts(2)
    env = token_env()
    args = run_args(hosts, ["-n", "2", "--tee", "none", "--max-failures", "1", "--join-timeout", "5", SLEEPER], "gone")
    controller = hosts.popen(0, args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (joiner,) = start_joins(hosts, env, timeout=5)
    wait_for((hosts.shared / "gone" / "ready-1").exists, 60, "both hosts to run")
    hosts.cut(1)
    try:
        out, err = controller.communicate(timeout=60)
    finally:
        hosts.restore(1)
    assert controller.returncode == 1, err
    assert f"host 1 ({hosts.addr(1)}), unreachable for" in err, err
    assert "host 1 did not join within 5 s" in err, err
    joiner.wait(timeout=60)


@covers("run-working-folder-missing")
def test_a_working_folder_missing_on_a_host_is_named_and_not_retried(nshosts):
    """Workers start in the controller's working folder on every host; a
    host without it says so instead of blaming the program. A restart
    would meet the same missing folder, so with `--max-failures 3` the run
    ends after its first attempt, saying that no restart was made."""
    hosts = nshosts(2)
    hosts.run(0, ["mkdir", "/tmp/work"])
    env = token_env()
    args = run_args(hosts, ["-n", "2", "--join-timeout", "30", "--max-failures", "3", HELLO], "nowork")
    controller = hosts.popen(0, args, env=env, cwd="/tmp/work", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (joiner,) = start_joins(hosts, env, timeout=30)
    out, err = controller.communicate(timeout=120)
    joiner.wait(timeout=30)
    exits("run-working-folder-missing", subprocess.CompletedProcess(args, controller.returncode, out, err))
    assert "meshrun: run 'nowork' failed (attempt 1): rank 1 could not start: the run's working folder '/tmp/work' is not on this host: every host needs the program and its folder at the same path as the controller's machine; a restart cannot change this, so the run ends now (3 restarts left unused)\n" in err, err
    assert "restarting" not in err, err
    run = json.loads((hosts.tmp(0) / "runs" / "nowork" / "run.json").read_text())
    assert [a["state"] for a in run["attempts"]] == ["failed"], run["attempts"]
    assert run["attempts"][0]["failure"]["cause"]["deterministic"] is True


@pytest.mark.slow
def test_meshrun_join_says_what_it_takes_part_in_and_exits_with_the_runs_outcome(nshosts):
    """`meshrun join` names the run and its host rank once, each attempt it
    takes part in, a restart as a restart (not a lost connection), and how
    the run ended; it exits 0 when the run succeeded and 1 when it failed,
    as `meshrun run` does, so a scheduler sees a failed run on every node."""
    hosts = nshosts(2)
    script = str(SCRIPTS / "fail_first_attempt.py")
    said = {}
    for name, failures in (("again", "1"), ("once", "0")):
        env = token_env()
        controller = hosts.popen(0, run_args(hosts, ["-n", "2", "--tee", "none", "--max-failures", failures, script], name), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        (joiner,) = start_joins(hosts, env, timeout=30)
        controller.communicate(timeout=120)
        out, _ = joiner.communicate(timeout=60)
        said[name] = (controller.returncode, joiner.returncode, [line for line in out.splitlines() if line.startswith("meshrun join: ")])
    addr = listen_addr(hosts)
    assert said["again"] == (
        0,
        0,
        [
            f"meshrun join: joined run 'again' at {addr} as host 1",
            "meshrun join: attempt 1: started rank 1 on this host",
            "meshrun join: attempt 1 is over and the run restarts: joining the next attempt",
            "meshrun join: attempt 2: started rank 1 on this host",
            "meshrun join: run 'again' ended: succeeded",
        ],
    ), said["again"]
    assert said["once"] == (
        1,
        1,
        [
            f"meshrun join: joined run 'once' at {addr} as host 1",
            "meshrun join: attempt 1: started rank 1 on this host",
            "meshrun join: run 'once' ended: failed",
        ],
    ), said["once"]


@pytest.mark.slow
def test_a_joined_host_that_lost_its_memory_restores_from_its_buddy_over_the_network(nshosts, gpt_data, gpt_reference):
    """The GPT on 2 hosts that share nothing (host 1 joined with `meshrun
    join`), a memory checkpoint every step and no durable one before the
    end: host 1's worker is killed and everything host 1 kept in memory is
    wiped. The restart hands both ranks to warm spares, host 1 fetches its
    step back from host 0's replica over the bridge, and the final
    parameters equal those of an uninterrupted run on one host."""
    # The shared reference's 30 steps, each paced (0.3 s before its report)
    # so that the run is still training when the kill comes, on a fast
    # machine too (16 unpaced steps were done before it on one).
    train = [PACED, *GPT_TINY, "--steps", "30"]
    launch = ["-n", "2", "--devices-per-proc", "2", "--tee", "none"]

    hosts = nshosts(2)
    env = token_env()
    # The data set sits in the storage both hosts see.
    shutil.copytree(gpt_data, hosts.shared / "data")
    train += ["--data-dir", str(hosts.shared / "data")]
    args = run_args(hosts, [*launch, "--memory-checkpoint-every", "1", "--checkpoint-every", "1000", "--max-failures", "1", *train, "--params-digest", str(hosts.shared / "mem.sha")], "mem")
    controller = hosts.popen(0, args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (joiner,) = start_joins(hosts, env, timeout=120)
    run_dir = hosts.tmp(0) / "runs" / "mem"
    events = lambda kind: [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]  # noqa: E731
    try:
        wait_for(lambda: controller.poll() is not None or any(e["step"] >= 4 for e in events("memory_checkpoint_committed")), 300, "memory checkpoint of step 4")
        assert controller.poll() is None, controller.communicate()[1]
        # The spares start once every rank has trained a step.
        wait_for(lambda: controller.poll() is not None or (hosts.spares(0) and hosts.spares(1)), 120, "the warm spares of both hosts")
        worker = next(e["pid"] for e in events("worker_started") if e["rank"] == 1)
        agent = next(e["pid"] for e in events("agent_joined") if e["host"] == 1)
        held = list((hosts.scratch(1) / "memory").iterdir())
        assert len(held) == 1 and controller.poll() is None, f"the run ended before the kill (host 1's memory holds {held})"
        (memory,) = held
        # Host 1's workers kept their executables; host 0 took a replica
        # of them after a memory commit.
        (executables,) = (hosts.scratch(1) / "runs").glob("*/executables")
        kept_count = len(list(executables.glob("*.xla")))
        assert kept_count, "host 1's workers kept no executables"
        replica = hosts.scratch(0) / "runs" / memory.name / "replica-of-1" / "executables"
        wait_for(lambda: controller.poll() is not None or len(list(replica.glob("*.xla"))) == kept_count, 60, "host 0's replica of host 1's executables")
        try:
            # Host 0 keeps host 1's replica of the newest step committed
            # everywhere until a newer one is (the agents release older
            # replicas only then), so whenever host 1 loses everything it
            # kept, the step the restart asks for is in host 0's hands.
            freeze_agent_and_kill_worker(agent, worker)
            for kept in memory.iterdir():
                shutil.rmtree(kept)
            # ...and its executables, as a host restarted on another machine.
            shutil.rmtree(executables)
        finally:
            os.kill(agent, signal.SIGCONT)
        out, err = controller.communicate(timeout=900)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.communicate(timeout=30)
    assert controller.returncode == 0, err
    assert joiner.wait(timeout=60) == 0, joiner.stdout.read()
    resumed = events("resuming_from_memory")
    # Said whole if it fails: why memory was not used, and what the
    # controller said of the attempts.
    shown = ("memory_unavailable", "attempt_started", "attempt_ended", "worker_exited", "resuming_from_memory", "agent_left", "run_ended")
    if len(resumed) != 1:
        # pytest.fail, not assert: an assertion's message is cut short.
        said = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] in shown]
        lines = [line for line in err.splitlines() if "attempt" in line or "memory" in line]
        pytest.fail(f"the restart did not resume from memory:\nevents: {said}\ncontroller: {lines}")
    (resumed,) = resumed
    assert resumed["sources"][0] == "this host's memory"
    assert resumed["sources"][1].startswith(f"the buddy's replica ({hosts.addr(0)}:"), resumed
    assert f"; executables: {kept_count} from the buddy ({hosts.addr(0)}:" in resumed["sources"][1], resumed
    # So the restarted host loaded its train step instead of compiling it.
    steps = sorted((e["attempt"], e["rank"], e["outcome"]) for e in events("executable") if e["name"].endswith(".train_step"))
    assert steps == [(1, 0, "compiled"), (1, 1, "compiled"), (2, 0, "loaded"), (2, 1, "loaded")], steps
    assert all(e["replicated"] for e in events("memory_checkpoint_committed"))
    warm = {e["rank"]: e.get("warm", False) for e in events("worker_started") if e["attempt"] == 2}
    assert warm == {0: True, 1: True}, f"the restart did not go to the spares: {warm}"
    assert (hosts.shared / "mem.sha").read_text() == gpt_reference(*GPT_TINY, "--steps", "30").digest
    # Nothing durable was ever saved: only memory could resume it.
    assert not list((hosts.shared / "mem" / "checkpoints").glob("step-*"))
    # The run's memory is gone from both hosts when it ends.
    for h in (0, 1):
        assert not any((hosts.scratch(h) / "memory").iterdir()), f"host {h} kept memory after the run"
