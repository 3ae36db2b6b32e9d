"""The short form of `make test-compat`: meshrun's abi3 wheel installed into
a user's venv of another Python and JAX than .venv's (Python 3.12, JAX
0.12, compat/py3.12-jax0.12.lock), running there the compatibility suite's
tests marked `short` (tests/compat/): launch, jax.distributed with a
collective, report, every hook on JAX's private modules live, the
compilation cache read back by rank 1, no Ray.

Its set-up is made before pytest by `make test` (`make compat-short-venv`),
since pip needs PyPI and tests reach only loopback: on a fresh machine,
about 1 minute for the venv (pip downloads JAX) plus the wheel, which takes
seconds after `make install` (maturin reuses what `maturin develop`
compiled; 3 to 4 minutes on 2 cores from a cold build). The test itself
takes about 35 s on 2 cores: 3 runs of 2 processes, and seconds to package
the wheel again when meshrun's sources changed."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

CELL = "py3.12-jax0.12"

# The cells check where the cache goes and that rank 1 hits its own entry.
pytestmark = [pytest.mark.slow, pytest.mark.own_compile_cache]


@pytest.mark.timeout(600)
def test_the_wheel_in_a_venv_of_python_3_12_and_jax_0_12():
    done = subprocess.run(
        [sys.executable, str(ROOT / "compat" / "cells.py"), "run", "--short", "--offline", CELL],
        capture_output=True, text=True, timeout=580, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().splitlines()[-1].split() == ["result", "pass"], done.stdout[-3000:]
