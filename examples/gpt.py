"""A small byte-level GPT (Flax NNX), trained with FSDP and tensor
parallelism across processes on the Python standard library's own source.

    meshrun run -n 2 --devices-per-proc 2 examples/gpt.py --fsdp 2 --tensor 2

The mesh is (data, fsdp, tensor). Rules shard attention heads and the MLP
hidden dimension over ``tensor`` (Megatron style: q/k/v and the MLP's first
layer by columns, the attention output and the MLP's second layer by rows)
and every other large weight over ``fsdp``; layer norms stay replicated.
The global batch is split over ``data`` and ``fsdp``. The training corpus is
built once, offline, from the interpreter's own ``.py`` files, and read by
meshrun's Rust data loader: each process gets its slice of every global
batch, in an order that does not depend on the number of processes.

Checkpoints and restarts come from meshrun, not from this file:

    meshrun run -n 2 --devices-per-proc 2 --checkpoint-every 25 --max-failures 3 \
        --name gpt examples/gpt.py --fsdp 2 --tensor 2

saves parameters, optimizer state and the loader's position every 25 steps;
a failed attempt restarts from the newest checkpoint, a preempted run
(SIGTERM) saves at the next step, and ``meshrun run --name gpt ...`` again
resumes where it stopped, with exactly the batches it would have seen.

``--size`` picks a model (``tiny``, the default, up to ``large``: 152M
parameters, whose parameters and Adam state take 1.70 GiB), and
``--fit-memory SIZE`` picks the mesh whose predicted peak fits SIZE per
device (see docs/fitting.md):

    meshrun run -n 4 --memory-per-proc 2GiB examples/gpt.py --size large \
        --fit-memory 2GiB --steps 5 --batch-size 4 --seq-len 64
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshrun
from meshrun import data, planning, sharding

RULES = [
    (r"attn/(q|k|v)/kernel", P("fsdp", "tensor")),
    (r"attn/(q|k|v)/bias", P("tensor")),
    (r"attn/o/kernel", P("tensor", "fsdp")),
    (r"mlp/fc/kernel", P("fsdp", "tensor")),
    (r"mlp/fc/bias", P("tensor")),
    (r"mlp/proj/kernel", P("tensor", "fsdp")),
    (r"(wte|wpe)/embedding", P(None, "fsdp")),
    (r"lm_head/kernel", P("fsdp", None)),
]
BATCH = P(("data", "fsdp"))


#: --size: (d_model, layers, heads, learning rate). Parameters at --seq-len 128, and with
#: Adam's two moments (float32) the bytes of the training state:
#: tiny 0.88M (10 MiB), small 10.9M (125 MiB), medium 57.2M (655 MiB),
#: large 152M (1.70 GiB).
SIZES = {
    "tiny": (128, 4, 4, 2e-3),
    "small": (384, 6, 6, 1e-3),
    "medium": (768, 8, 12, 6e-4),
    "large": (1024, 12, 16, 3e-4),
}


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    seq_len: int = 128
    d_model: int = 128
    layers: int = 4
    heads: int = 4


class Attention(nnx.Module):
    def __init__(self, cfg: Config, rngs: nnx.Rngs):
        self.heads = cfg.heads
        self.q = nnx.Linear(cfg.d_model, cfg.d_model, rngs=rngs)
        self.k = nnx.Linear(cfg.d_model, cfg.d_model, rngs=rngs)
        self.v = nnx.Linear(cfg.d_model, cfg.d_model, rngs=rngs)
        self.o = nnx.Linear(cfg.d_model, cfg.d_model, rngs=rngs)

    def __call__(self, x):
        b, t, d = x.shape
        split = lambda y: y.reshape(b, t, self.heads, d // self.heads)
        y = jax.nn.dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        return self.o(y.reshape(b, t, d))


class Mlp(nnx.Module):
    def __init__(self, cfg: Config, rngs: nnx.Rngs):
        self.fc = nnx.Linear(cfg.d_model, 4 * cfg.d_model, rngs=rngs)
        self.proj = nnx.Linear(4 * cfg.d_model, cfg.d_model, rngs=rngs)

    def __call__(self, x):
        return self.proj(jax.nn.gelu(self.fc(x)))


class Block(nnx.Module):
    def __init__(self, cfg: Config, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(cfg.d_model, rngs=rngs)
        self.attn = Attention(cfg, rngs)
        self.ln2 = nnx.LayerNorm(cfg.d_model, rngs=rngs)
        self.mlp = Mlp(cfg, rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nnx.Module):
    def __init__(self, cfg: Config, rngs: nnx.Rngs):
        self.wte = nnx.Embed(cfg.vocab, cfg.d_model, rngs=rngs)
        self.wpe = nnx.Embed(cfg.seq_len, cfg.d_model, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)])
        self.ln_f = nnx.LayerNorm(cfg.d_model, rngs=rngs)
        self.lm_head = nnx.Linear(cfg.d_model, cfg.vocab, use_bias=False, rngs=rngs)

    def __call__(self, tokens):
        x = self.wte(tokens) + self.wpe(jnp.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_corpus(out: Path) -> tuple[Path, Path]:
    """The standard library's .py files as bytes, 95% train / 5% validation,
    written once (atomically: every process may try at the same time)."""
    train, val = out / "train.bin", out / "val.bin"
    if train.exists() and val.exists():
        return train, val
    out.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    data = b"\n".join(p.read_bytes() for p in files)
    split = int(len(data) * 0.95)
    for path, chunk in ((train, data[:split]), (val, data[split:])):
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(chunk)
        os.replace(tmp, path)
    return train, val


#: What XLA's CPU compiler leaves on the process's heap once the step and
#: the initialisers are compiled (see docs/fitting.md).
COMPILER_CPU = 256 << 20


def activation_bytes(cfg: Config) -> int:
    """Bytes one sequence keeps for the backward pass (float32): per layer
    and token the block's inputs and outputs (about 16 x d_model values,
    the MLP's hidden ones included) and each head's attention row; then the
    logits and their softmax."""
    t = cfg.seq_len
    per_layer = t * (16 * cfg.d_model + cfg.heads * t)
    return 4 * (cfg.layers * per_layer + 3 * t * cfg.vocab)


def resident_bytes(key: str = "VmRSS") -> int:
    """This process's resident set now (Linux), 0 where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_resident_bytes() -> int:
    """The most this process's resident set has been."""
    return resident_bytes("VmHWM")


def plans_for(args: argparse.Namespace, cfg: Config, abstract_params, tx, memory: str | int) -> list[planning.Fit]:
    """Every mesh of the run's devices, with what the planner predicts."""
    return planning.plan(
        abstract_params,
        RULES,
        memory,
        optimizer=tx,
        devices=jax.device_count(),
        global_batch=args.batch_size,
        activations_per_example=activation_bytes(cfg),
        # On CPU the device's memory is the process's: what it holds before
        # the state (the interpreter, JAX, the corpus) counts against it, and
        # so does what XLA's compiler keeps of the heap once it has compiled
        # the step (256 MiB, from the medium and large models: docs/fitting.md).
        runtime=(resident_bytes() + COMPILER_CPU) // jax.local_device_count() if jax.default_backend() == "cpu" else 0,
        layers=cfg.layers,
    )


def fit_mesh(args: argparse.Namespace, plans: list[planning.Fit], rank: int) -> planning.Fit:
    """--fit-memory: the first mesh, by least communication, whose predicted
    peak per device fits; the plans are printed by rank 0."""
    chosen = next((p for p in plans if p.fits and args.batch_size % (p.data * p.fsdp) == 0), None)
    if rank == 0:
        print(f"gpt: meshes of {jax.device_count()} device(s) for {args.fit_memory} per device:\n{planning.table(plans)}", flush=True)
    if chosen is None:
        advice = "; ".join(plans[-1].lowered_by()) if plans else ""
        raise SystemExit(f"gpt: no mesh of {jax.device_count()} device(s) fits {args.fit_memory} per device; {advice}")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch size (sequences)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--size", choices=list(SIZES), default="tiny", help="model preset: d_model, layers, heads (each may be given apart)")
    parser.add_argument("--d-model", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--fit-memory", metavar="SIZE", help="pick the mesh whose predicted peak fits SIZE (such as 2GiB) per device; --data/--fsdp/--tensor are then ignored")
    parser.add_argument("--lr", type=float, help="learning rate (default: the --size preset's)")
    parser.add_argument("--data", type=int, default=-1, help="mesh data axis (-1: the rest)")
    parser.add_argument("--fsdp", type=int, default=1)
    parser.add_argument("--tensor", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default="data/stdlib-bytes")
    parser.add_argument("--describe", action="store_true", help="print the parameter table and exit")
    parser.add_argument("--sample-log", type=Path, help="append every step's record ids to DIR/rank-R.jsonl (for checking exact resumption)")
    parser.add_argument("--params-digest", type=Path, help="write the SHA-256 of the final parameters here")
    parser.add_argument("--step-times", type=Path, help="write rank 0's per-step wall times (JSON) here")
    parser.add_argument("--compile-each-attempt", action="store_true", help="trace and compile in every attempt (no travelling executables; for comparison)")
    parser.add_argument("--xla-cpu-ynn", action="store_true", help="keep XLA's experimental YNNPACK fusions on CPU (off by default here: see below)")
    # Only for launching by hand without meshrun (bench/step_parity.py compares the two).
    parser.add_argument("--coordinator", help="explicit jax.distributed coordinator address")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    args = parser.parse_args()

    if not args.xla_cpu_ynn and "ynn_fusion_type" not in os.environ.get("XLA_FLAGS", ""):
        # XLA's CPU backend hands dots to YNNPACK graphs (an experimental
        # fusion) that each executable builds on its first run: with this
        # model on 2-core x86 machines that first run took 0.3 s longer
        # (so did every restart's), and steady steps were about 2% slower.
        # XLA reads the flag when the backend starts, after this line.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type=").strip()
    if args.coordinator:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    ctx = meshrun.init()
    rank, nprocs = jax.process_index(), jax.process_count()
    d_model, layers, heads, lr = SIZES[args.size]
    cfg = Config(seq_len=args.seq_len, d_model=args.d_model or d_model, layers=args.layers or layers, heads=args.heads or heads)
    train_path, val_path = build_corpus(Path(args.data_dir))

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(args.lr or lr, b2=0.99, weight_decay=0.01))

    def init_model():
        return nnx.split(GPT(cfg, nnx.Rngs(args.seed)))

    def init_params():
        return init_model()[1]

    if args.fit_memory:
        plans = plans_for(args, cfg, jax.eval_shape(init_model)[1], tx, args.fit_memory)
        chosen = fit_mesh(args, plans, rank)
        mesh = sharding.make_mesh(data=chosen.data, fsdp=chosen.fsdp, tensor=chosen.tensor)
    else:
        mesh = sharding.make_mesh(data=args.data, fsdp=args.fsdp, tensor=args.tensor)
        if args.size != "tiny" and rank == 0:
            plans = plans_for(args, cfg, jax.eval_shape(init_model)[1], tx, 1 << 40)
            chosen = next(p for p in plans if (p.data, p.fsdp, p.tensor) == tuple(mesh.shape.values()))
    if (args.fit_memory or args.size != "tiny") and rank == 0:
        print(f"gpt: {chosen}\ngpt: predicted peak {chosen.peak} bytes per device", flush=True)

    # Shapes and shardings first; the arrays are then either created directly
    # in their shards (no process holds the model whole) or, on a restart,
    # read from the newest checkpoint into those shards without creating
    # them at all. meshrun.eval_shape and meshrun.jit are JAX's, but what
    # they trace and compile is kept for a restart, which loads it instead.
    travel = not args.compile_each_attempt
    eval_shape = meshrun.eval_shape if travel else jax.eval_shape
    jit = functools.partial(meshrun.jit, travel=travel)
    graphdef, abstract_params = eval_shape(init_model)
    abstract = {"params": abstract_params, "opt": eval_shape(tx.init, abstract_params)}
    param_shardings = sharding.shardings_for(abstract["params"], RULES, mesh)
    opt_shardings = sharding.shardings_for(abstract["opt"], RULES, mesh)
    target = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        abstract,
        {"params": param_shardings, "opt": opt_shardings},
    )
    # Before anything is allocated: under meshrun, what the state needs per
    # device goes to the controller, which explains an out-of-memory end with it.
    described = sharding.describe(target)
    if args.describe:
        if rank == 0:
            print(described, flush=True)
        return
    ckpt = None if not ctx.run_dir else meshrun.get_checkpoint()
    if ckpt is None:
        params = jit(init_params, out_shardings=param_shardings)()
        opt_state = jit(tx.init, out_shardings=opt_shardings)(params)

    batch_sharding = NamedSharding(mesh, BATCH)
    replicated = NamedSharding(mesh, P())

    def loss_fn(params, tokens):
        logits = nnx.merge(graphdef, params)(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:].astype(jnp.int32)).mean()

    def train_step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    train_step = jit(
        train_step,
        in_shardings=(param_shardings, opt_shardings, batch_sharding),
        out_shardings=(param_shardings, opt_shardings, replicated),
        donate_argnums=(0, 1),
    )
    eval_loss = jit(loss_fn, in_shardings=(param_shardings, batch_sharding), out_shardings=replicated)

    B, T = args.batch_size, args.seq_len
    # Resume: parameters, optimizer state and the loader's position, from the
    # newest committed checkpoint of this run (restored into the current
    # shardings, whatever layout saved them).
    first_step, loader_state = 0, None
    if ckpt is not None:
        restored = meshrun.restore(target, ckpt)
        params, opt_state = restored["params"], restored["opt"]
        first_step, loader_state = ckpt.step, ckpt.extra["loader"]
        if rank == 0:
            print(f"gpt: resumed from step {first_step} ({ckpt.path})", flush=True)
    train = data.Loader(data.tokens(train_path, "uint8", T), B, seed=args.seed, mesh=mesh, spec=BATCH, rank=rank, num_processes=nprocs, state=loader_state)
    # The same validation windows every time: a fixed random sample of them.
    val = data.Loader(data.tokens(val_path, "uint8", T), B, seed=12345, num_epochs=1, mesh=mesh, spec=BATCH, rank=rank, num_processes=nprocs)
    val_batches = [batch["tokens"] for _, batch in zip(range(args.eval_batches), val)]

    def val_bpb() -> float:
        losses = [eval_loss(params, tokens) for tokens in val_batches]
        return float(np.mean([float(l) for l in losses])) / math.log(2)

    if ckpt is None:
        bpb_start = val_bpb()
        if rank == 0:
            print(f"gpt: {sum(x.size for x in jax.tree.leaves(params)):,} parameters, mesh {dict(mesh.shape)}, "
                  f"{nprocs} process(es); validation {bpb_start:.3f} bits/byte at start", flush=True)
        meshrun.report({"step": 0, "val_bpb": bpb_start})
    else:
        bpb_start = ckpt.extra["val_bpb_start"]  # a restart goes straight back to training

    started, in_flight = None, None
    bpb = bpb_start
    step_times: list[float] = []
    last = time.perf_counter()
    for step in range(first_step, args.steps):
        batch = next(train)
        params, opt_state, loss = train_step(params, opt_state, batch["tokens"])
        if args.sample_log:
            with open(args.sample_log / f"rank-{rank}.jsonl", "a") as f:
                f.write(json.dumps({"step": step + 1, "attempt": ctx.attempt, "index": batch["index"].tolist()}) + "\n")
        # At most two steps in flight (see examples/digits_dp.py).
        if in_flight is not None:
            in_flight.block_until_ready()
        in_flight = loss
        now = time.perf_counter()
        step_times.append(now - last)
        last = now
        if step == first_step:
            loss.block_until_ready()
            started = time.perf_counter()  # after the first step's compile
        record = {"step": step + 1, "loss": loss}
        if started is not None and step > first_step:
            record["tokens_per_s"] = (step - first_step) * B * T / (time.perf_counter() - started)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            bpb = val_bpb()
            record["val_bpb"] = bpb
            if rank == 0:
                print(f"step {step + 1:5d}  loss {float(loss):.3f}  val {bpb:.3f} bits/byte  "
                      f"{record.get('tokens_per_s', 0):,.0f} tokens/s", flush=True)
        # Under `meshrun run --checkpoint-every N` the state goes with every
        # report: meshrun saves it every N steps, and at the next step when
        # the run is preempted (SIGTERM); under --memory-checkpoint-every N
        # it keeps it in the hosts' memory every N steps.
        if ctx.checkpoint_every or ctx.memory_every:
            meshrun.report(record, checkpoint={"params": params, "opt": opt_state}, extra={"loader": train.state(), "val_bpb_start": bpb_start}, total_steps=args.steps)
        else:
            meshrun.report(record, total_steps=args.steps)
    if args.params_digest:
        # Every process gathers the full parameters; rank 0 writes their digest.
        full = multihost_utils.process_allgather(params, tiled=True)
        digest = hashlib.sha256()
        for leaf in jax.tree.leaves(full):
            digest.update(np.ascontiguousarray(leaf).tobytes())
        if rank == 0:
            args.params_digest.write_text(digest.hexdigest())
    if rank == 0 and args.step_times:
        args.step_times.write_text(json.dumps(step_times))
    if args.fit_memory or args.size != "tiny":
        # What the planner is checked against (docs/fitting.md): the peak of
        # this process's resident set.
        print(f"gpt: rank {rank} peak resident set {peak_resident_bytes()} bytes", flush=True)
    if rank == 0:
        where = f"; run files in {ctx.run_dir}" if ctx.run_dir else ""
        print(f"gpt: validation {bpb_start:.3f} -> {bpb:.3f} bits/byte over {args.steps} steps{where}", flush=True)


if __name__ == "__main__":
    main()
