"""meshrun's hooks on JAX's private modules (meshrun._jax_private), against
this venv's JAX: each finds what it expects for this version, and one that
cannot says so once instead of going silently off."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import pytest

from meshrun import _jax_private


@pytest.mark.short
def test_this_jax_is_a_tested_version():
    assert _jax_private.jax_version()[:2] in _jax_private.TESTED


@pytest.mark.short
def test_the_cache_writer_is_wrapped_with_this_jaxs_parameters():
    from jax._src import compiler

    before = list(inspect.signature(compiler._cache_write).parameters)
    _jax_private.cache_from_every_process()
    assert _jax_private.hook_status()["cache_from_every_process"] == "on"
    assert compiler._cache_write._meshrun
    assert list(inspect.signature(compiler._cache_write).parameters) == before


@pytest.mark.short
def test_the_cluster_environment_base_is_found():
    base = _jax_private.cluster_env_base()
    assert base is not None and _jax_private.hook_status()["cluster_env"] == "on"
    assert isinstance(base._cluster_types, list)


@pytest.mark.short
def test_the_flight_recorders_hooks_are_placed_and_see_a_compile_and_a_call():
    import jax
    import jax.numpy as jnp
    from jax._src import compiler

    seen: list[str] = []
    on = _jax_private.watch_programs(lambda executable, text, devices: seen.append(f"compiled {len(text()) > 0}"), lambda executable: seen.append("called"), lambda executable: False)
    assert on and _jax_private.hook_status()["flight_recorder"] == "on"
    assert compiler.compile_or_get_cached._meshrun
    jax.jit(lambda x: x * 3 + 1)(jnp.ones(3))
    assert seen[:2] == ["compiled True", "called"], seen


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_a_cache_writer_of_another_shape_is_left_alone_and_said_once():
    """What a JAX whose writer meshrun does not know gets: JAX's own
    writer, the hook off, and one warning on rank 0 naming the version
    and what the run loses."""
    done = run_python(
        """
        from jax._src import compiler
        from meshrun import _jax_private

        def other(cache_key, module_name, executable, backend, compile_time):
            return "other"

        compiler._cache_write = other
        _jax_private.cache_from_every_process()
        _jax_private.cache_from_every_process()
        assert compiler._cache_write is other
        print(_jax_private.hook_status()["cache_from_every_process"])
        """,
        MESHRUN_RANK="0",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("off: jax._src.compiler._cache_write takes"), done.stdout
    warnings = [line for line in done.stderr.splitlines() if line.startswith("meshrun: warning: JAX")]
    assert len(warnings) == 1, done.stderr
    assert "compile again on every restart" in warnings[0]


def test_other_ranks_do_not_repeat_the_warning():
    done = run_python(
        """
        from jax._src import compiler
        from meshrun import _jax_private

        compiler._cache_write = lambda *args: None
        _jax_private.cache_from_every_process()
        print(_jax_private.hook_status()["cache_from_every_process"])
        """,
        MESHRUN_RANK="1",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("off:") and "warning" not in done.stderr


@pytest.mark.short
def test_the_cache_reader_is_wrapped_with_this_jaxs_parameters():
    """meshrun.jit keeps the cache's bytes of an executable JAX read from
    its persistent cache (serialized again on CPU, it lacks its kernels)."""
    from jax._src import compilation_cache

    before = list(inspect.signature(compilation_cache.get_executable_and_time).parameters)
    _jax_private.cache_reads_kept()
    assert _jax_private.hook_status()["cache_reads_kept"] == "on"
    assert compilation_cache.get_executable_and_time._meshrun
    assert list(inspect.signature(compilation_cache.get_executable_and_time).parameters) == before


def test_an_executable_read_from_the_cache_travels_whole(tmp_path):
    """With this JAX: a run whose first compile is a cache hit keeps an
    executable that a new process loads and runs."""
    import json
    from pathlib import Path

    script = str(Path(__file__).resolve().parents[1] / "scripts" / "travel_keys.py")
    cache = tmp_path / "cache"

    def call(scratch: Path) -> dict:
        env = {"MESHRUN_SCRATCH": str(scratch), "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        import os

        done = subprocess.run([sys.executable, script, "2x2", "2.0"], capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    fresh = call(tmp_path / "a")
    call(tmp_path / "b")  # a cache hit, kept
    loaded = call(tmp_path / "b")
    assert loaded["outcomes"] == [["loaded", None]]
    assert loaded["y"] == fresh["y"]
