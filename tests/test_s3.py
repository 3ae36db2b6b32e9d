"""Checkpoints in object storage, on a real S3 server (SeaweedFS on
loopback, see s3server.py): saved with one layout and restored onto others,
corruption caught and named by URL, a rank killed in the middle of an
upload, the GPT killed and resumed from S3 bit for bit, and every mistake
with the storage found before training starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import GPT, GPT_TINY, HELLO, MESHRUN, ROOT, SCRIPTS, meshrun, read_jsonl, start, stop, wait_for
from errors_page import covers, exits
from nshosts import nshosts_unavailable
from s3fakes import NetnsWithAWayOut, answering, instance_metadata, s3_error, shell_without_aws

SCRIPT = str(SCRIPTS / "ckpt_roundtrip.py")
LAUNCH = ["-n", "2", "--devices-per-proc", "2", "--tee", "none"]


def ckpt_cli(env, *args):
    return subprocess.run([str(MESHRUN), "ckpt", *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


def events(run_dir, kind):
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]


@pytest.fixture(scope="module")
def saved(s3server, tmp_path_factory):
    """The tree of ckpt_roundtrip.py saved on 2 processes x 2 devices
    (fsdp 2 x tensor 2) to s3://meshrun-saved/team/runs/ck."""
    s3server.bucket("meshrun-saved")
    runs = tmp_path_factory.mktemp("s3ckpt") / "runs"
    storage = "s3://meshrun-saved/team/runs"
    done = meshrun([*LAUNCH, "--storage", storage, SCRIPT, "save", "2", "2"], runs_dir=runs, name="ck", env=s3server.env())
    assert done.code == 0, done.stderr
    committed = events(done.run_dir, "checkpoint_committed")
    assert [(e["step"], e["path"]) for e in committed] == [(5, f"{storage}/ck/checkpoints/step-5")]
    objects = s3server.objects("meshrun-saved/team/runs/ck/checkpoints")
    assert "meshrun-saved/team/runs/ck/checkpoints/step-5/manifest.json" in objects, objects
    # The run folder (logs, events) stays here; nothing of the checkpoint.
    assert not (done.run_dir / "checkpoints").exists() or not list((done.run_dir / "checkpoints").iterdir())
    return runs, storage


@pytest.mark.slow
@pytest.mark.parametrize("launch, mesh", [(["-n", "1", "--devices-per-proc", "4"], ["1", "4"]), (["-n", "4"], ["4", "1"])])
def test_restore_from_s3_onto_another_layout(s3server, saved, launch, mesh):
    runs, storage = saved
    done = meshrun([*launch, "--tee", "none", "--storage", storage, SCRIPT, "restore", *mesh], runs_dir=runs, name="ck", env=s3server.env())
    assert done.code == 0, done.stderr
    restored = sorted(done.run_dir.glob("restored-*.json"))
    assert len(restored) == int(launch[1])
    for path in restored:
        assert json.loads(path.read_text()) == {"step": 5, "ok": {"w": True, "b16": True, "ids": True}, "metrics": {"loss": 1.5}}


@covers("s3-flipped-byte")
def test_ckpt_cli_finds_lists_and_verifies_s3_checkpoints_and_catches_a_flipped_byte(s3server, saved, tmp_path):
    runs, storage = saved
    env = s3server.env()
    step = f"{storage}/ck/checkpoints/step-5"
    # By the run's name (its run.json names the storage), by --storage, and
    # by the URL of the run's storage folder.
    for args in (["ck", "--runs-dir", runs], ["ck", "--storage", storage], [f"{storage}/ck"]):
        ls = ckpt_cli(env, "ls", *args)
        assert ls.returncode == 0, ls.stderr
        assert ["5", "6", "855", step] in [line.split() for line in ls.stdout.splitlines()], ls.stdout
    inspect = ckpt_cli(env, "inspect", step)
    assert inspect.returncode == 0 and "total: 6 leaves, 855 bytes" in inspect.stdout, inspect.stdout + inspect.stderr
    verify = ckpt_cli(env, "verify", step)
    assert verify.returncode == 0 and "every CRC matches" in verify.stdout, verify.stderr
    out = tmp_path / "model.safetensors"
    assert ckpt_cli(env, "export", step, out).returncode == 0 and out.stat().st_size > 855

    # A copy of the step with one byte of a shard flipped.
    fs = s3server.filesystem()
    src, dst = "meshrun-saved/team/runs/ck/checkpoints/step-5", "meshrun-saved/damaged/step-5"
    for key in s3server.objects(src):
        data = fs.open_input_stream(key).readall()
        if key.endswith("rank-0.safetensors"):
            data = bytearray(data)
            data[-5] ^= 0x01
        with fs.open_output_stream(key.replace(src, dst)) as f:
            f.write(bytes(data))
    bad = ckpt_cli(env, "verify", "s3://" + dst)
    exits("s3-flipped-byte", bad)
    assert f"checksum mismatch in 's3://{dst}/rank-0.safetensors', tensor '" in bad.stderr, bad.stderr
    # Nothing was committed there by accident, and the original verifies.
    assert ckpt_cli(env, "verify", step).returncode == 0


@covers("s3-wrong-key", "s3-no-bucket", "s3-no-answer", "s3-bad-scheme")
def test_storage_mistakes_are_named_before_training_starts(s3server, s3_bucket, tmp_path):
    """A wrong key, a bucket that does not exist and an endpoint nobody
    answers at: each ends `meshrun run` with status 2 before a worker
    starts, naming the storage URL and what was wrong."""
    hello = str(SCRIPTS / "hello.py")
    cases = [
        ("s3-wrong-key", s3server.env(AWS_SECRET_ACCESS_KEY="wrong"), f"{s3_bucket}/runs"),
        ("s3-no-bucket", s3server.env(), "s3://no-such-bucket/runs"),
        ("s3-no-answer", s3server.env(AWS_ENDPOINT_URL="http://127.0.0.1:9"), f"{s3_bucket}/runs"),
        ("s3-bad-scheme", s3server.env(), "ftp://host/x"),
    ]
    for row, env, storage in cases:
        done = meshrun(["-n", "1", "--storage", storage, hello], runs_dir=tmp_path / "runs", name="bad", env=env, timeout=120)
        exits(row, done)
        assert f"storage '{storage}' cannot be used" in done.stderr, done.stderr
        assert not (tmp_path / "runs" / "bad").exists(), "a refused run made its folder"
    assert s3server.objects(s3_bucket.removeprefix("s3://")) == {}, "a refused run left objects behind"


@pytest.mark.slow
def test_a_rank_killed_in_the_middle_of_an_upload_damages_nothing_and_the_restart_resumes(s3server, s3_bucket, tmp_path):
    """Each rank uploads 40 MiB (a multipart upload); rank 1 is SIGKILLed
    right after handing step 2 over. Step 1 stays committed and whole; the
    restart removes what step 2 left, resumes from step 1 with every value
    checked, and commits step 2."""
    storage = f"{s3_bucket}/runs"
    prefix = storage.removeprefix("s3://") + "/kill/checkpoints"
    done = meshrun(["-n", "2", "--tee", "none", "--max-failures", "1", "--storage", storage, str(SCRIPTS / "s3_save_kill.py"), "40"], runs_dir=tmp_path / "runs", name="kill", env=s3server.env(), timeout=300)
    assert done.code == 0, done.stderr
    failed = events(done.run_dir, "worker_failed")
    assert len(failed) == 1 and failed[0]["rank"] == 1, failed
    assert [e["from_step"] for e in events(done.run_dir, "restarting")] == [1]
    committed = [(e["attempt"], e["step"]) for e in events(done.run_dir, "checkpoint_committed")]
    assert committed == [(1, 1), (2, 2)], committed
    for rank in (0, 1):
        starts = read_jsonl(done.run_dir / f"verified-{rank}.jsonl")
        assert [(s["attempt"], s["restored"]) for s in starts] == [(1, None), (2, 1)]
    objects = s3server.objects(prefix)
    assert sorted({k.split("/")[-2] for k in objects}) == ["step-1", "step-2"], objects
    # What attempt 1 left of step 2 was removed when attempt 2 opened, the
    # killed rank's unfinished upload included.
    discarded = [e["path"] for e in events(done.run_dir, "checkpoint_discarded")]
    assert f"{storage}/kill/checkpoints/step-2" in discarded, discarded
    assert s3server.unfinished_uploads(s3_bucket.removeprefix("s3://")) == []
    for step in (1, 2):
        check = ckpt_cli(s3server.env(), "verify", f"{storage}/kill/checkpoints/step-{step}")
        assert check.returncode == 0, check.stderr


@pytest.mark.slow
def test_the_gpt_killed_resumes_from_s3_bit_identical(s3server, s3_bucket, tmp_path, gpt_data, gpt_reference):
    """The GPT on 2 processes x 2 devices with its checkpoints on S3: rank 1
    SIGKILLed after the first commit; the restart resumes from S3 and ends
    with the parameters of an uninterrupted run, bit for bit."""
    # The steps of the restart tests' shared reference (tests/conftest.py).
    steps = 30
    data = ["--data-dir", gpt_data]
    common = [*LAUNCH, "--checkpoint-every", "5"]

    storage = f"{s3_bucket}/team"
    run_dir = tmp_path / "runs" / "s3"
    args = [*common, "--max-failures", "1", "--storage", storage, GPT, *GPT_TINY, "--steps", str(steps), *data, "--params-digest", str(tmp_path / "s3.sha")]
    proc = start(args, runs_dir=tmp_path / "runs", name="s3", env=s3server.env())
    try:
        wait_for(lambda: proc.poll() is not None or events(run_dir, "checkpoint_committed"), 300, "the first commit")
        assert proc.poll() is None, proc.communicate()[1]
        pid = next(e["pid"] for e in events(run_dir, "worker_started") if e["rank"] == 1)
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    restarts = events(run_dir, "restarting")
    assert len(restarts) == 1 and restarts[0]["from_step"] is not None
    resumed = events(run_dir, "resuming")
    assert [e["step"] for e in resumed] == [restarts[0]["from_step"]]
    assert all(e["path"].startswith(f"{storage}/s3/checkpoints/step-") for e in events(run_dir, "checkpoint_committed"))
    assert (tmp_path / "s3.sha").read_text() == gpt_reference(*GPT_TINY, "--steps", str(steps)).digest


@pytest.mark.slow
def test_the_storage_down_during_saves_costs_those_checkpoints_only(tmp_path):
    """The S3 server is killed while the ranks save at every step. With
    the default policy the saves that fail are recorded (naming the URL),
    nothing of theirs is committed, training goes on, and once the server
    is back the next save commits. With `--on-save-error fail` the same
    outage fails the run, naming the storage."""
    from s3server import S3Server

    server = S3Server(tmp_path / "s3").start()
    runs, procs = tmp_path / "runs", []
    try:
        storage = server.bucket("meshrun-outage") + "/runs"
        script = str(SCRIPTS / "save_through_outage.py")

        def commits(run_dir):
            return events(run_dir, "checkpoint_committed")

        run_dir = runs / "goes-on"
        proc = start(["-n", "2", "--tee", "none", "--checkpoint-every", "1", "--storage", storage, script], runs_dir=runs, name="goes-on", env=server.env())
        procs.append(proc)
        wait_for(lambda: proc.poll() is not None or commits(run_dir), 120, "the first commit")
        server.kill()
        wait_for(lambda: proc.poll() is not None or events(run_dir, "checkpoint_failed"), 90, "a failed save")
        assert proc.poll() is None, proc.communicate()[1]
        before = len(commits(run_dir))
        server.start()
        wait_for(lambda: proc.poll() is not None or len(commits(run_dir)) > before, 90, "a commit after the outage")
        (run_dir / "stop-now").write_text("")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert events(run_dir, "worker_failed") == [] and events(run_dir, "restarting") == []
        failed = events(run_dir, "checkpoint_failed")
        # A save fails in a rank's upload ("rank N: cannot upload ..."), or,
        # when the server goes down between the ranks' uploads and the
        # commit, in the controller's write of the step's manifest: each
        # names the storage and who failed.
        said = [e["error"] for e in failed]
        assert all(storage in s and (s.startswith("rank ") or s.startswith(f"cannot write '{storage}/goes-on/checkpoints/step-")) for s in said), said
        lost = {e["step"] for e in failed}
        assert not lost & {e["step"] for e in commits(run_dir)}, "a step that failed to save was committed"
        assert "was not saved, training goes on" in (run_dir / "logs" / "rank-0.log").read_text() + (run_dir / "logs" / "rank-1.log").read_text()
        newest = commits(run_dir)[-1]["path"]
        assert subprocess.run([str(MESHRUN), "ckpt", "verify", newest], capture_output=True, env=server.env(), timeout=120).returncode == 0

        run_dir = runs / "fails"
        proc = start(["-n", "2", "--tee", "none", "--checkpoint-every", "1", "--on-save-error", "fail", "--storage", storage, script], runs_dir=runs, name="fails", env=server.env())
        procs.append(proc)
        wait_for(lambda: proc.poll() is not None or commits(run_dir), 120, "the first commit")
        server.kill()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, err
        assert "StorageError" in err and f"{storage}/fails/checkpoints/step-" in err, err
    finally:
        for p in procs:
            stop(p)
        server.close()


def test_credentials_and_region_come_from_an_aws_profile(s3server, s3_bucket, tmp_path):
    """Without AWS_ACCESS_KEY_ID in the environment, the keys come from
    the profile AWS_PROFILE names in the credentials file, as the AWS tools
    take them; a profile with a wrong key is refused naming the URL."""
    from s3server import ACCESS_KEY, SECRET_KEY

    credentials, config = tmp_path / "credentials", tmp_path / "config"
    credentials.write_text(f"[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = wrong\n\n[team]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    config.write_text("[profile team]\nregion = us-east-1\n")
    env = s3server.env(AWS_SHARED_CREDENTIALS_FILE=str(credentials), AWS_CONFIG_FILE=str(config), AWS_PROFILE="team")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        del env[key]
    listed = ckpt_cli(env, "ls", f"{s3_bucket}/runs/none")
    assert listed.returncode == 0 and f"no committed checkpoints in '{s3_bucket}/runs/none/checkpoints'" in listed.stdout, listed.stderr
    refused = ckpt_cli({**env, "AWS_PROFILE": "default"}, "ls", f"{s3_bucket}/runs/none")
    assert refused.returncode == 1 and f"'{s3_bucket}/runs/none/checkpoints'" in refused.stderr and "access denied" in refused.stderr, refused.stderr


@covers("s3-no-credentials")
def test_without_credentials_nothing_is_sent_and_the_message_names_the_variables(tmp_path):
    """In a shell without AWS variables or ~/.aws, an s3:// storage is
    refused before any request. Run in a network namespace whose one way
    out counts what it transmits, `meshrun run --storage` and `meshrun ckpt
    ls` send nothing (the instance metadata service at 169.254.169.254 is
    not asked) and name the variables that are missing. A datagram to that
    address from the same namespace is counted: a probe would have been."""
    if (why := nshosts_unavailable()) is not None:
        pytest.skip(why)
    env, runs = shell_without_aws(tmp_path), tmp_path / "runs"
    with NetnsWithAWayOut() as ns:
        before = ns.sent()
        run = ns.run([str(MESHRUN), "run", "--runs-dir", str(runs), "--name", "nocreds", "-n", "1", "--storage", "s3://meshrun-nocreds/runs", HELLO], env=env, cwd=ROOT)
        listed = ns.run([str(MESHRUN), "ckpt", "ls", "s3://meshrun-nocreds/runs/x"], env=env)
        sent = ns.sent() - before
        assert sent == 0, f"{sent} packets left the namespace:\n{run.stderr}\n{listed.stderr}"
        exits("s3-no-credentials", run)
        assert listed.returncode == 1, listed.stderr
        assert "no AWS credentials or endpoint in this shell (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are unset" in listed.stderr, listed.stderr
        assert "169.254.169.254" not in run.stderr + listed.stderr and "access denied" not in run.stderr + listed.stderr
        assert not (runs / "nocreds").exists(), "a refused run made its folder"
        probe = "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('169.254.169.254', 80))"
        assert ns.run([sys.executable, "-c", probe]).returncode == 0
        assert ns.sent() > before, "the namespace counts nothing: the test would not see a probe"


def test_the_instance_metadata_service_is_asked_only_when_allowed(s3server, s3_bucket, tmp_path):
    """Without keys, the S3 client asks the instance metadata service (here
    one on loopback, AWS_METADATA_ENDPOINT) only with
    MESHRUN_S3_INSTANCE_METADATA=1, and then works with the credentials it
    hands out; with 0, or unset, the service gets no request at all."""
    from s3server import ACCESS_KEY, SECRET_KEY

    with answering(instance_metadata(ACCESS_KEY, SECRET_KEY)) as (metadata, asked):
        env = {**shell_without_aws(tmp_path), "AWS_ENDPOINT_URL": s3server.endpoint, "AWS_REGION": "us-east-1", "AWS_METADATA_ENDPOINT": metadata}
        for off in ({}, {"MESHRUN_S3_INSTANCE_METADATA": "0"}):
            refused = ckpt_cli({**env, **off}, "ls", f"{s3_bucket}/runs/none")
            assert refused.returncode == 1 and "no AWS credentials in this shell" in refused.stderr, refused.stderr
        assert asked == [], "the instance metadata service was asked without MESHRUN_S3_INSTANCE_METADATA=1"
        listed = ckpt_cli({**env, "MESHRUN_S3_INSTANCE_METADATA": "1"}, "ls", f"{s3_bucket}/runs/none")
    assert listed.returncode == 0 and f"no committed checkpoints in '{s3_bucket}/runs/none/checkpoints'" in listed.stdout, listed.stderr
    assert asked[:2] == [("PUT", "/latest/api/token"), ("GET", "/latest/meta-data/iam/security-credentials/")], asked


@covers("s3-instance-metadata-bad")
def test_a_mistyped_instance_metadata_switch_is_refused(s3server, s3_bucket, tmp_path):
    done = meshrun(["-n", "1", "--storage", f"{s3_bucket}/runs", HELLO], runs_dir=tmp_path / "runs", name="bad", env=s3server.env(MESHRUN_S3_INSTANCE_METADATA="maybe"))
    exits("s3-instance-metadata-bad", done)
    assert not (tmp_path / "runs" / "bad").exists(), "a refused run made its folder"


def test_a_server_error_is_named_by_the_servers_own_code_and_message(tmp_path):
    """A server that fails every request with 500 and an S3 error document
    (as SeaweedFS does when it has no free volume left): the message says
    the server's status, code and message first, and not the hint for an
    endpoint that does not answer, since it did."""
    from s3server import ACCESS_KEY, SECRET_KEY

    with answering(s3_error(500, "InternalError", "no free volumes")) as (endpoint, asked):
        env = {**shell_without_aws(tmp_path), "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}
        listed = ckpt_cli(env, "ls", "s3://meshrun-full/runs/x")
        run = meshrun(["-n", "1", "--storage", "s3://meshrun-full/runs", HELLO], runs_dir=tmp_path / "runs", name="full", env=env)
    said = "the server answered 500 Internal Server Error: InternalError: no free volumes"
    assert listed.returncode == 1 and f"cannot list 's3://meshrun-full/runs/x/checkpoints': {said}" in listed.stderr, listed.stderr
    assert run.code == 2 and "storage 's3://meshrun-full/runs' cannot be used: cannot write 's3://meshrun-full/runs/full/.meshrun-probe-" in run.stderr and f"': {said}" in run.stderr, run.stderr
    for stderr in (listed.stderr, run.stderr):
        assert "AWS_ENDPOINT_URL" not in stderr and "did not answer" not in stderr and "access denied" not in stderr, stderr
    assert len(asked) > 1, asked
