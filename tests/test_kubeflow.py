"""Kubeflow's two JAXJob examples, unmodified, under meshrun: on 2 local
processes and on 2 hosts that share nothing (network namespaces, joined
with ``meshrun join``).

The examples are Kubeflow's code and are not part of meshrun: point
``MESHRUN_KUBEFLOW_EXAMPLES`` at the ``examples/jax`` folder of a
kubeflow/training-operator checkout from before its v1 examples were
removed (``git show 7858371b4^:examples/jax/...``), or run
``make test-kubeflow KUBEFLOW_EXAMPLES=...``. Their ``datasets.py`` downloads
MNIST; ``tests/kubeflow/datasets.py`` is a stand-in with the same
``mnist()``, from data on this machine, put beside the example. The
launcher contract these examples read (PROCESS_ID, NUM_PROCESSES,
COORDINATOR_ADDRESS, COORDINATOR_PORT) is tested without them in
test_launchers.py and test_launcher.py.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import meshrun
from hostsrun import meshrun_on

HERE = Path(__file__).parent
EXAMPLES = os.environ.get("MESHRUN_KUBEFLOW_EXAMPLES")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not EXAMPLES, reason="MESHRUN_KUBEFLOW_EXAMPLES is not set: Kubeflow's examples are not part of meshrun (see this file's docstring)"),
]


def copy_examples(out: Path) -> Path:
    """The examples, unmodified, in ``out``, with the stand-in datasets.py
    beside the MNIST one."""
    source = Path(EXAMPLES or "")
    wanted = [source / "cpu-demo" / "train.py", source / "jax-dist-spmd-mnist" / "spmd_mnist_classifier_fromscratch.py"]
    missing = [str(p) for p in wanted if not p.is_file()]
    assert not missing, f"MESHRUN_KUBEFLOW_EXAMPLES={EXAMPLES}: not found: {missing}"
    for path in wanted:
        (out / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, out / path.parent.name / path.name)
    shutil.copy(HERE / "kubeflow" / "datasets.py", out / "jax-dist-spmd-mnist" / "datasets.py")
    return out


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    return copy_examples(tmp_path / "examples")


def check_cpu_demo(done) -> None:
    assert done.code == 0, done.stderr
    for rank in (0, 1):
        log = done.log(rank)
        assert f"JAX process {rank}/1 initialized" in log, log
        assert "JAX device count:2" in log, log
        # pmap's psum of ones over the 2 processes' devices.
        assert "[2.]" in log, log


def check_mnist(done) -> float:
    assert done.code == 0, done.stderr
    for rank in (0, 1):
        log = done.log(rank)
        assert "JAX process count:2" in log and "Epoch 9 in" in log, log
    accuracies = [float(a) for a in re.findall(r"^Test set accuracy ([0-9.]+)$", done.log(0), re.M)]
    assert len(accuracies) == 10, done.log(0)
    print(f"pmap MNIST test accuracy by epoch: {accuracies}")
    # Trained, not just run: chance is 0.1.
    assert accuracies[-1] > 0.6, accuracies
    return accuracies[-1]


def test_kubeflow_cpu_demo_on_two_processes(examples, runs):
    check_cpu_demo(meshrun(["-n", "2", str(examples / "cpu-demo" / "train.py")], runs_dir=runs, timeout=120))


def test_kubeflow_pmap_mnist_on_two_processes(examples, runs):
    check_mnist(meshrun(["-n", "2", str(examples / "jax-dist-spmd-mnist" / "spmd_mnist_classifier_fromscratch.py")], runs_dir=runs, timeout=300))


def test_kubeflow_examples_on_two_namespace_hosts(nshosts):
    hosts = nshosts(2)
    # Each host has a /tmp of its own: the examples go where every host sees them.
    examples = copy_examples(hosts.shared / "examples")
    check_cpu_demo(meshrun_on(hosts, ["-n", "2", str(examples / "cpu-demo" / "train.py")], name="cpu"))
    check_mnist(meshrun_on(hosts, ["-n", "2", str(examples / "jax-dist-spmd-mnist" / "spmd_mnist_classifier_fromscratch.py")], name="mnist"))
