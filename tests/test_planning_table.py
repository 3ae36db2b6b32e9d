"""The planner's table and advice for a model of a few MiB, where figures
rounded to whole MiB would read as 0 and stop adding up to the peak: shapes
only, no run."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from meshrun import planning

KERNEL = jax.ShapeDtypeStruct((640, 640), jnp.float32)
BIAS = jax.ShapeDtypeStruct((640,), jnp.float32)
PARAMS = {f"block{i}": {"kernel": KERNEL, "bias": BIAS} for i in range(2)}
RULES = [(r"kernel$", P("fsdp", None))]
TERMS = ("params", "opt", "grads", "updates", "gathered", "activations", "runtime")
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
FIGURE = re.compile(r"(\d+(?:\.\d+)?) (B|KiB|MiB|GiB)")


def small_plans() -> list[planning.Fit]:
    # Adam's two moments; 100 KiB of activations an example, a 3 MiB runtime.
    return planning.plan(
        PARAMS, RULES, "24MiB", opt_state={"mu": PARAMS, "nu": PARAMS}, devices=2,
        global_batch=4, activations_per_example=100 << 10, runtime=3 << 20, layers=2,
    )  # fmt: skip


def shown(text: str) -> tuple[float, float]:
    """A figure as the table shows it, in bytes, and half its last digit."""
    number, unit = FIGURE.fullmatch(text).groups()
    last = 10 ** -len(number.partition(".")[2])
    return float(number) * UNITS[unit], last / 2 * UNITS[unit]


def test_a_small_models_figures_are_not_zero_and_add_up_to_its_peak():
    plans = small_plans()
    lines = planning.table(plans).splitlines()
    head = lines[0].split()
    assert head[1:-1] == [*TERMS, "peak"]
    for fit, line in zip(plans, lines[1:], strict=True):
        figures = FIGURE.findall(line.removeprefix(fit.mesh))
        assert len(figures) == len(TERMS) + 1, line
        values = [shown(f"{n} {u}") for n, u in figures]
        for (value, half), exact in zip(values, [*(getattr(fit, t) for t in TERMS), fit.peak], strict=True):
            # Each figure is its value to the digit shown: none reads 0 unless it is.
            assert abs(value - exact) <= half, line
            assert (value > 0) == (exact > 0), line
        # The terms, as shown, add up to the peak as shown, to the digits shown.
        *terms, (peak, peak_half) = values
        assert abs(sum(v for v, _ in terms) - peak) <= sum(h for _, h in terms) + peak_half, line
        assert abs(sum(v for v, _ in terms) - peak) < 0.25 * UNITS["MiB"], line


@pytest.mark.parametrize(
    "size, text",
    [
        (0, "0 MiB"),
        (512, "512 B"),
        (1536, "1.5 KiB"),
        (200 << 10, "200 KiB"),
        (int(3.125 * UNITS["MiB"]), "3.1 MiB"),
        (3 << 20, "3 MiB"),
        # As out-of-memory summaries and docs/fitting.md have them.
        (96 << 20, "96 MiB"),
        (579 << 20, "579 MiB"),
        (int(1.13 * UNITS["GiB"]), "1.13 GiB"),
    ],
)
def test_sizes_read_to_a_tenth_below_100_of_their_unit(size, text):
    assert planning._size_text(size) == text


def test_lowered_by_lists_only_what_lowers_the_peak():
    by_mesh = {p.mesh: p for p in small_plans()}
    advice = by_mesh["data=1 fsdp=2 tensor=1"].lowered_by()
    assert [a.split(" ", 1)[0] for a in advice] == ["shard", "scan", "rematerialise"], advice
    for a in advice:
        # Says by how much, in figures that read as more than nothing.
        value, _ = shown(" ".join(FIGURE.findall(a)[-1]))
        assert value > 0 and "-" not in a.rsplit(":", 1)[1], a
    # Nothing gathered, one byte of activations, one of optimizer state: no
    # change here lowers the peak by a whole byte.
    tiny = planning.Fit(data=1, fsdp=1, tensor=1, params=4, opt=1, grads=4, updates=4, gathered=0, activations=1, runtime=0, memory=1 << 20, layers=2)
    assert tiny.lowered_by() == []
    # One layer: scanning it keeps what is gathered as it is.
    one_layer = planning.Fit(data=1, fsdp=2, tensor=1, params=0, opt=0, grads=0, updates=0, gathered=1 << 20, activations=0, runtime=0, memory=1 << 30)
    assert one_layer.lowered_by() == []
