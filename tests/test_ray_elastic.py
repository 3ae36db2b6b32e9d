"""An elastic run on a real Ray cluster (two nodes that share nothing, as in
test_ray.py): it starts on the hosts Ray can place, and grows when Ray has
room for more."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import GPT_TINY, ROOT, SCRIPTS, assert_none_left, read_jsonl, start, stop, wait_for
from test_ray import RAY_ENV, on_ray, two_nodes  # noqa: F401 (the fixture)

PACED = str(SCRIPTS / "gpt_paced.py")
TINY = GPT_TINY[: GPT_TINY.index("--fsdp")]

# Another job on the cluster: holds `CPU` bundles until its stdin closes.
HOG = """
import sys, ray
from ray.util.placement_group import placement_group, remove_placement_group
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False, configure_logging=False)
pg = placement_group([{"CPU": 1}] * int(sys.argv[2]), strategy="PACK")
ray.get(pg.ready(), timeout=120)
print("held", flush=True)
sys.stdin.read()
remove_placement_group(pg)
ray.shutdown()
"""


@pytest.mark.slow
def test_on_ray_an_elastic_run_starts_with_what_fits_and_grows_when_ray_has_room(two_nodes, tmp_path):  # noqa: F811
    """4 CPUs in the cluster, 3 held by another job: `--hosts 1:2` (a host
    is a bundle of 1 CPU) starts on the one host Ray can place, after the
    rejoin timeout. When the other job lets go, the second host's bundle is
    placed, its agent waits, and the run grows to 2 hosts at its next
    report and ends there."""
    hog = subprocess.Popen([sys.executable, "-c", HOG, two_nodes.address, "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **RAY_ENV}, cwd=ROOT)
    storage = two_nodes.hosts.shared / tmp_path.name
    storage.mkdir()
    runs = tmp_path / "runs"
    run_dir = runs / "grow"
    events = lambda kind: [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]  # noqa: E731
    proc = None
    try:
        assert hog.stdout.readline().strip() == "held", hog.stderr.read()
        launch = ["-n", "2", "--hosts", "1:2", "--devices-per-proc", "2", "--platform", "cpu", "--checkpoint-every", "2", "--rejoin-timeout", "3", "--storage", str(storage), "--tee", "none"]
        train = [PACED, *TINY, "--fsdp", "2", "--steps", "40", "--data-dir", str(tmp_path / "data")]
        proc = start(on_ray(two_nodes, *launch, *train), runs_dir=runs, name="grow", env={"GPT_PACE_S": "0.3"})
        wait_for(lambda: proc.poll() is not None or events("checkpoint_committed"), 240, "a commit on the one host Ray placed")
        assert proc.poll() is None, proc.communicate()[1]
        assert [(e["hosts"], e["previous_hosts"]) for e in events("resized")] == [(1, None)]
        hog.communicate(timeout=60)  # its stdin closes: it lets go
        _, err = proc.communicate(timeout=400)
    finally:
        if proc is not None:
            stop(proc)
        if hog.poll() is None:
            hog.kill()
        hog.communicate()
    assert proc.returncode == 0, err
    assert [(e["attempt"], e["hosts"]) for e in events("resized")] == [(1, 1), (2, 2)]
    assert [(e["from_hosts"], e["to_hosts"]) for e in events("growing")] == [(1, 2)]
    ended = {e["attempt"]: e["state"] for e in events("attempt_ended")}
    assert ended == {1: "resized", 2: "succeeded"}, ended
    assert not events("worker_failed")
    steps = {r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["attempt"] == 2 and "loss" in r["metrics"]}
    assert max(steps) == 40
    assert_none_left(run_dir)
