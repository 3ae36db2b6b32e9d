"""Data-parallel MLP on scikit-learn's bundled 8x8 handwritten digits.

Run it with meshrun on any number of processes and devices; with the same
global batch size every layout computes the same per-step losses:

    meshrun run -n 2 --devices-per-proc 2 examples/digits_dp.py
    meshrun run -n 1 --devices-per-proc 4 examples/digits_dp.py
    meshrun run -n 2 --hosts 2 --devices-per-proc 2 examples/digits_dp.py

Each global batch is drawn from a seeded permutation, every process puts its
contiguous slice of it on its own devices, and the gradient is averaged over
the whole batch by XLA's all-reduce (across processes through
``jax.distributed``).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import meshrun


def init_params(key: jax.Array, sizes: tuple[int, ...]) -> list[dict[str, jax.Array]]:
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        scale = jnp.sqrt(2.0 / fan_in)
        params.append({"w": jax.random.normal(sub, (fan_in, fan_out)) * scale, "b": jnp.zeros((fan_out,))})
    return params


def forward(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
    logits = forward(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    ctx = meshrun.init()
    devices = jax.device_count()
    if args.batch_size % devices:
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of the device count {devices}")
    mesh = jax.make_mesh((devices,), ("data",), axis_types=(AxisType.Auto,))
    batch_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)

    optimizer = optax.adam(args.lr)
    sizes = (x.shape[1], args.hidden, args.hidden, 10)
    params = jax.jit(lambda k: init_params(k, sizes), out_shardings=replicated)(jax.random.key(args.seed))
    opt_state = jax.jit(optimizer.init, out_shardings=replicated)(params)

    @jax.jit
    def train_step(params, opt_state, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # This process's contiguous slice of every global batch.
    per_proc = args.batch_size // ctx.world_size
    lo, hi = ctx.rank * per_proc, (ctx.rank + 1) * per_proc
    n = len(x_train)
    steps_per_epoch = n // args.batch_size

    started = time.perf_counter()
    in_flight = None
    for step in range(args.steps):
        epoch, i = divmod(step, steps_per_epoch)
        order = np.random.default_rng(args.seed + epoch).permutation(n)
        idx = order[i * args.batch_size : (i + 1) * args.batch_size][lo:hi]
        xb = jax.make_array_from_process_local_data(batch_sharding, x_train[idx], (args.batch_size, x.shape[1]))
        yb = jax.make_array_from_process_local_data(batch_sharding, y_train[idx], (args.batch_size,))
        params, opt_state, loss = train_step(params, opt_state, xb, yb)
        # At most two steps in flight. With unbounded asynchronous dispatch,
        # multi-process CPU collectives (gloo) on this 2-core machine hung
        # now and then, also when launched by hand without meshrun.
        if in_flight is not None:
            in_flight.block_until_ready()
        in_flight = loss
        meshrun.report({"step": step, "loss": loss}, total_steps=args.steps)
        if ctx.rank == 0 and step % 100 == 0:
            print(f"step {step:4d}  loss {float(loss):.4f}", flush=True)
    elapsed = time.perf_counter() - started

    predict = jax.jit(lambda p, xs: jnp.argmax(forward(p, xs), axis=-1), out_shardings=replicated)
    accuracy = float((np.asarray(predict(params, x_test)) == y_test).mean())
    meshrun.report({"step": args.steps, "test_accuracy": accuracy, "train_seconds": elapsed})
    if ctx.rank == 0:
        print(
            f"digits: {ctx.world_size} process(es) x {jax.local_device_count()} device(s), "
            f"{args.steps} steps in {elapsed:.1f}s, test accuracy {accuracy:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
