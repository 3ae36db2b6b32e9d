"""Executables that travel between attempts (`meshrun.jit`): a restart loads
what an earlier attempt compiled, unless it was made for something else or
is damaged, and what it loads is checked against the program."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SCRIPTS, meshrun as meshrun_run, read_jsonl
from errors_page import covers, raises, says

import meshrun
from meshrun import _native

KEYS = str(SCRIPTS / "travel_keys.py")


def first_call(scratch: Path, layout: str, scale: float, cache: Path | None = None) -> dict:
    """One fresh process's first call of the jitted function (with JAX's
    persistent compilation cache in ``cache``, every compile kept)."""
    env = {**os.environ, "MESHRUN_SCRATCH": str(scratch), "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if cache is not None:
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    done = subprocess.run([sys.executable, KEYS, layout, str(scale)], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def stored(scratch: Path, name: str) -> tuple[str, dict]:
    [(key, meta)] = [(k, json.loads(m)) for k, m in _native.list_executables(scratch) if json.loads(m)["name"] == name]
    return key, meta


def test_a_first_call_loads_what_an_earlier_process_compiled_for_the_same_mesh_and_jax(tmp_path):
    compiled = first_call(tmp_path, "2x2", 2.0)
    assert compiled["outcomes"] == [["compiled", "no executable of this function for these arguments yet"]]
    loaded = first_call(tmp_path, "2x2", 2.0)
    assert loaded["outcomes"] == [["loaded", None]] and loaded["stale"] is None
    assert np.array_equal(loaded["y"], compiled["y"])
    assert loaded["shapes"] == [3, 2]


@pytest.mark.slow
def test_an_executable_made_for_another_mesh_or_jax_or_damaged_is_compiled_again_saying_why(tmp_path):
    first_call(tmp_path, "2x2", 2.0)
    # Another mesh over the same devices: same shapes, other shardings.
    other = first_call(tmp_path, "4", 2.0)
    [(outcome, why)] = other["outcomes"]
    assert outcome == "compiled" and why.startswith("the arguments' shardings (another mesh) differ"), why
    # Another JAX version string (the file rewritten with it).
    key, meta = stored(tmp_path, "step")
    _, payload = _native.load_executable(tmp_path, key)
    _native.store_executable(tmp_path, key, json.dumps({**meta, "jax": "0.0.1"}), payload)
    [(outcome, why)] = first_call(tmp_path, "4", 2.0)["outcomes"]
    assert outcome == "compiled" and why.startswith('JAX differ: "0.0.1" when it was compiled'), why
    # Truncated, then one byte changed: never handed to JAX.
    path = tmp_path / "executables" / f"{key}.xla"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    [(outcome, why)] = first_call(tmp_path, "4", 2.0)["outcomes"]
    assert outcome == "compiled" and "is damaged" in why and "bytes of payload" in why, why
    whole = path.read_bytes()
    path.write_bytes(whole[:-100] + bytes([whole[-100] ^ 1]) + whole[-99:])
    again = first_call(tmp_path, "4", 2.0)
    [(outcome, why)] = again["outcomes"]
    assert outcome == "compiled" and "is damaged" in why and "CRC-32C" in why, why
    assert first_call(tmp_path, "4", 2.0)["outcomes"] == [["loaded", None]]


@pytest.mark.slow
@covers("jit-stale")
def test_a_loaded_executable_whose_program_changed_is_found_stale_and_removed(tmp_path):
    """The key cannot see a closure: `scale` changes the program, not the
    key. The loaded executable computes with the old value; its check says
    so (what a save waits for), removes it, and the next process compiles."""
    first = first_call(tmp_path, "2x2", 2.0)
    changed = first_call(tmp_path, "2x2", 3.0)
    assert changed["outcomes"] == [["loaded", None]]
    says("jit-stale", changed["stale"])
    assert np.array_equal(changed["y"], first["y"])  # what the check is for
    after = first_call(tmp_path, "2x2", 3.0)
    assert after["outcomes"] == [["compiled", "no executable of this function for these arguments yet"]]
    assert after["stale"] is None and after["shapes"] == [3, 3]
    assert not np.array_equal(after["y"], first["y"])


@pytest.mark.slow
def test_an_executable_jax_read_from_its_compilation_cache_travels_whole(tmp_path):
    """On CPU an executable JAX loaded from its persistent cache, serialized
    again, lacks its kernels: a process that loads it fails at its first run
    ("Function ... not found"). meshrun keeps the cache's own bytes."""
    cache = tmp_path / "cache"
    fresh = first_call(tmp_path / "a", "2x2", 2.0, cache)
    assert fresh["outcomes"] == [["compiled", "no executable of this function for these arguments yet"]]
    assert any(cache.iterdir()), "JAX kept no cache entry"
    # Another run's first attempt: a cache hit, kept for its restart.
    hit = first_call(tmp_path / "b", "2x2", 2.0, cache)
    assert hit["outcomes"] == fresh["outcomes"]
    restarted = first_call(tmp_path / "b", "2x2", 2.0, cache)
    assert restarted["outcomes"] == [["loaded", None]]
    assert np.array_equal(restarted["y"], fresh["y"])


@covers("jit-static-arguments", "jit-argument-type")
def test_what_a_travelling_function_cannot_take_is_said(tmp_path, monkeypatch):
    raises("jit-static-arguments", lambda: meshrun.jit(lambda x, n: x * n, static_argnums=1))
    monkeypatch.setenv("MESHRUN_SCRATCH", str(tmp_path))
    raises("jit-argument-type", lambda: meshrun.jit(lambda x: x)("a"))
    assert not any(tmp_path.iterdir()), "nothing is kept for a call that was refused"


@pytest.mark.slow
def test_an_attempt_that_loaded_a_stale_executable_fails_and_the_next_compiles_from_storage(runs):
    """Attempt 2 loads attempt 1's executable, compiled for another value of
    the closure; its check finds it stale, the attempt fails with
    StaleExecutableError, and attempt 3 compiles and starts from storage
    (here: from the start), not from the memory checkpoints attempt 2 kept
    while it was being checked."""
    done = meshrun_run(["-n", "2", "--platform", "cpu", "--tee", "none", "--max-failures", "2", "--memory-checkpoint-every", "1", str(SCRIPTS / "stale_closure.py")], runs_dir=runs)
    assert done.code == 0, done.stderr
    events = read_jsonl(done.run_dir / "events.jsonl")
    outcomes = sorted((e["attempt"], e["rank"], e["outcome"]) for e in events if e["event"] == "executable")
    assert outcomes == [(1, 0, "compiled"), (1, 1, "compiled"), (2, 0, "loaded"), (2, 0, "stale"), (2, 1, "loaded"), (2, 1, "stale"), (3, 0, "compiled"), (3, 1, "compiled")], outcomes
    failed = [e for e in events if e["event"] == "worker_failed"]
    assert [f["attempt"] for f in failed] == [1, 2] and failed[1]["cause"]["exception"] == "StaleExecutableError", failed
    # Memory held steps of attempts 1 and 2 (attempt 2's unchecked)...
    assert [e for e in events if e["event"] == "memory_checkpoint_committed" and e["attempt"] in (1, 2)]
    # ...which attempt 3 did not take.
    assert 3 not in [e["attempt"] for e in events if e["event"] in ("resuming_from_memory", "resuming")]
    # Attempt 3 trained every step with its own scale: v = 1, 4, 13, ...
    last = [r for r in read_jsonl(done.run_dir / "metrics.jsonl") if r["attempt"] == 3]
    v = 0.0
    for r in last:
        v = v * 3 + 1
        assert r["metrics"]["v"] == v, last
    assert [r["step"] for r in last] == list(range(1, 13))
