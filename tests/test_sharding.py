"""meshrun.sharding in this process, on 4 CPU devices."""

from __future__ import annotations

import importlib.util
import math
import sys

import jax

jax.config.update("jax_num_cpu_devices", 4)

import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402
from conftest import ROOT  # noqa: E402
from errors_page import covers, raises  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from meshrun import ConfigError, sharding  # noqa: E402


def load_gpt():
    spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpt_example"] = module
    spec.loader.exec_module(module)
    return module


def test_make_mesh_fills_the_minus_one_axis():
    mesh = sharding.make_mesh(fsdp=2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 1}
    # tensor varies fastest, then fsdp: neighbouring devices share a tensor group
    mesh = sharding.make_mesh(data=1, fsdp=2, tensor=2)
    ids = np.vectorize(lambda d: d.id)(mesh.devices)
    assert ids.tolist() == [[[0, 1], [2, 3]]]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"data": 3, "fsdp": 1}, "mesh data=3 x fsdp=1 x tensor=1 has 3 devices, but the run has 4"),
        ({"fsdp": 3}, "the other axes multiply to 3, which does not divide the 4 devices"),
        ({"data": -1, "fsdp": -1}, "only one mesh axis may be -1"),
        ({"tensor": 0}, "mesh axis tensor=0 must be a positive integer or -1"),
    ],
)
def test_make_mesh_errors_name_the_counts(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        sharding.make_mesh(**kwargs)


def test_first_matching_rule_wins_and_default_applies():
    rules = [(r"attn/q", P("fsdp")), (r"attn", P("tensor")), (r"kernel", P(None, "fsdp"))]
    assert sharding.spec_for("blocks/0/attn/q/kernel", rules) == P("fsdp")
    assert sharding.spec_for("blocks/0/attn/k/kernel", rules) == P("tensor")
    assert sharding.spec_for("mlp/kernel", rules) == P(None, "fsdp")
    assert sharding.spec_for("ln/scale", rules) == P()
    assert sharding.spec_for("ln/scale", rules, default=P("data")) == P("data")




def test_optimizer_state_follows_its_parameter():
    gpt = load_gpt()
    mesh = sharding.make_mesh(data=1, fsdp=2, tensor=2)
    cfg = gpt.Config(d_model=32, layers=1, heads=2, seq_len=16)
    params = sharding.init_sharded(lambda: nnx.split(gpt.GPT(cfg, nnx.Rngs(0)))[1], gpt.RULES, mesh)
    opt = optax.adam(1e-3)
    opt_sh = sharding.shardings_for(jax.eval_shape(opt.init, params), gpt.RULES, mesh)
    opt_state = jax.jit(opt.init, out_shardings=opt_sh)(params)
    param_specs = {sharding._path_str(p): leaf.sharding.spec for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    moments = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        name = sharding._path_str(path)
        for prefix in ("0/mu/", "0/nu/"):
            if name.startswith(prefix):
                assert leaf.sharding.spec == param_specs[name[len(prefix):]], name
                moments += 1
    assert moments == 2 * len(param_specs)
    q = params["blocks"][0]["attn"]["q"]["kernel"][...]
    assert q.sharding.spec == P("fsdp", "tensor")
    assert opt_state[0].count.sharding.spec == P()


def test_plain_pytree_shard_and_global_batch():
    mesh = sharding.make_mesh(data=2, fsdp=2)
    tree = {"w": np.arange(32, dtype=np.float32).reshape(8, 4), "b": np.ones(4, np.float32)}
    placed = sharding.shard(tree, [("w", P("fsdp", None))], mesh)
    assert placed["w"].sharding.spec == P("fsdp", None)
    np.testing.assert_array_equal(np.asarray(placed["w"]), tree["w"])
    batch = sharding.global_batch(np.arange(8 * 3).reshape(8, 3), mesh)
    assert batch.shape == (8, 3) and batch.sharding.spec == P(("data", "fsdp"))


def test_fsdp_memory_is_a_quarter_plus_replicated_leftovers():
    gpt = load_gpt()
    mesh = sharding.make_mesh(data=1, fsdp=4)
    cfg = gpt.Config(d_model=64, layers=2, heads=4, seq_len=32)
    params = sharding.init_sharded(lambda: nnx.split(gpt.GPT(cfg, nnx.Rngs(0)))[1], gpt.RULES, mesh)
    opt = optax.adamw(1e-3)
    opt_state = jax.jit(opt.init, out_shardings=sharding.shardings_for(jax.eval_shape(opt.init, params), gpt.RULES, mesh))(params)
    tree = {"params": params, "opt": opt_state}
    table = sharding.describe(tree)
    # What each device really holds, from the arrays' own shards.
    held = {d: 0 for d in jax.devices()}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            held[shard.device] += shard.data.nbytes
    largest = max(held.values())
    replicated = table.replicated_bytes_per_device
    assert replicated > 0, "layer norms and counters are replicated and must be listed"
    assert largest <= (table.total_bytes - replicated) / 4 + replicated
    assert largest == table.bytes_per_device
    assert largest < table.total_bytes / 2
    # By part: what each device holds of the parameters, from their own
    # shards, and of the optimizer's state (Adam's two moments and more).
    params_held = max(sum(s.data.nbytes for leaf in jax.tree.leaves(params) for s in leaf.addressable_shards if s.device == d) for d in jax.devices())
    assert list(table.by_part) == ["opt", "params"] or list(table.by_part) == ["params", "opt"], table.by_part
    assert table.by_part["params"] == params_held
    assert table.by_part["opt"] == table.bytes_per_device - params_held >= 2 * params_held
    text = str(table)
    assert "blocks/0/attn/q/kernel" in text and "('fsdp', 'tensor')" in text
    assert "total per device" in text
    assert f"params {params_held:,} bytes" in text
    assert math.isclose(table.total_bytes, sum(x.nbytes for x in jax.tree.leaves(tree)))


# Rows of docs/errors.md.

@covers("mesh-product-not-device-count", "mesh-two-unknown-axes", "mesh-axis-zero")
def test_meshes_that_do_not_fit_the_devices():
    raises("mesh-product-not-device-count", lambda: sharding.make_mesh(data=3))
    raises("mesh-two-unknown-axes", lambda: sharding.make_mesh(data=-1, fsdp=-1))
    raises("mesh-axis-zero", lambda: sharding.make_mesh(data=0))


@covers("rule-dimension-not-divisible", "rule-unknown-axis", "rule-too-many-dimensions")
def test_rules_that_do_not_fit_the_parameters():
    mesh = sharding.make_mesh(data=1, fsdp=4)
    tree = {"layer": {"kernel": jax.ShapeDtypeStruct((6, 8), np.float32), "bias": jax.ShapeDtypeStruct((8,), np.float32)}}
    raises("rule-dimension-not-divisible", lambda: sharding.shardings_for(tree, [("kernel", P("fsdp", None))], mesh))
    raises("rule-unknown-axis", lambda: sharding.shardings_for(tree, [("kernel", P("model"))], mesh))
    raises("rule-too-many-dimensions", lambda: sharding.shardings_for(tree, [("bias", P("fsdp", None))], mesh))


# meshrun.planning: the bytes it lays out are describe's, mesh by mesh.

@pytest.mark.parametrize("shape", [dict(data=4), dict(data=1, fsdp=4), dict(data=1, fsdp=2, tensor=2), dict(data=2, tensor=2)])
def test_the_planners_bytes_per_device_are_what_describe_counts(shape):
    from meshrun import planning

    gpt = load_gpt()
    cfg = gpt.Config(d_model=64, layers=2, heads=4, seq_len=32)
    abstract = jax.eval_shape(lambda: nnx.split(gpt.GPT(cfg, nnx.Rngs(0)))[1])
    tx = optax.adamw(1e-3)
    mesh = sharding.make_mesh(**shape)
    placed = {
        "params": sharding.shardings_for(abstract, gpt.RULES, mesh),
        "opt": sharding.shardings_for(jax.eval_shape(tx.init, abstract), gpt.RULES, mesh),
    }
    shapes = {"params": abstract, "opt": jax.eval_shape(tx.init, abstract)}
    described = sharding.describe(jax.tree.map(lambda s, p: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=p), shapes, placed))
    plans = planning.plan(abstract, gpt.RULES, "1GiB", optimizer=tx, devices=4)
    sizes = dict(mesh.shape)
    (fit,) = [p for p in plans if (p.data, p.fsdp, p.tensor) == (sizes["data"], sizes["fsdp"], sizes["tensor"])]
    assert (fit.params, fit.opt) == (described.by_part["params"], described.by_part["opt"])
    assert fit.state == described.bytes_per_device
    # Gathering over fsdp brings each device the rest of every weight its
    # fsdp group holds: the parameters with the fsdp axis taken out.
    whole = planning.bytes_per_device(planning._leaves(abstract, gpt.RULES, P()), sizes, drop="fsdp")
    assert fit.gathered == (whole - fit.params if sizes["fsdp"] > 1 else 0)


def test_plans_come_least_communication_first_and_say_what_lowers_them():
    from meshrun import planning

    gpt = load_gpt()
    cfg = gpt.Config(d_model=64, layers=2, heads=4, seq_len=32)
    abstract = jax.eval_shape(lambda: nnx.split(gpt.GPT(cfg, nnx.Rngs(0)))[1])
    plans = planning.plan(abstract, gpt.RULES, 4 << 20, optimizer=optax.adamw(1e-3), devices=4, global_batch=8, activations_per_example=1 << 20, layers=2)
    order = [(p.tensor, p.fsdp) for p in plans]
    assert order == sorted(order) and order[0] == (1, 1)
    # Replicated over 4 data shards, Adam's state does not fit 4 MiB; fsdp=4 does.
    by_mesh = {p.mesh: p for p in plans}
    assert not by_mesh["data=4 fsdp=1 tensor=1"].fits and by_mesh["data=1 fsdp=4 tensor=1"].fits
    advice = by_mesh["data=1 fsdp=4 tensor=1"].lowered_by()
    assert any(a.startswith("scan the layers") for a in advice) and any(a.startswith("rematerialise") for a in advice)
    assert "data=1 fsdp=4 tensor=1" in planning.table(plans)
    with pytest.raises(ConfigError, match="cannot read 'lots' as a memory size"):
        planning.plan(abstract, gpt.RULES, "lots", devices=4)
    assert planning.parse_size("1.5GiB") == 3 << 29 and planning.parse_size("2GB") == 2 * 10**9
