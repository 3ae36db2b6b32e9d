#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU (not needed for CI): on one
# GPU (--platform cuda), the workers' environment, an unmodified
# jax.distributed script, the demo GPT's median step time, and a
# checkpoint saved from the GPU and resumed onto it, whose final
# parameters must equal those of the same steps trained straight (with
# XLA's deterministic GPU ops), and --memory-per-proc as XLA's share of the
# GPU, with the device's memory per rank in memory.jsonl.
#
#   bench/gpu_check.sh                 sets up .venv (make install) and adds
#                                      JAX's CUDA plugin at the lock's version
#   PYTHON=python3 bench/gpu_check.sh  a Python that already has meshrun and
#                                      JAX for CUDA (flax, optax too)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  make install || exit 1
  PYTHON=.venv/bin/python
  jax_version=$($PYTHON -c 'import jax; print(jax.__version__)')
  $PYTHON -m pip install --quiet "jax[cuda12]==${jax_version}" || exit 1
fi
out=$(mktemp -d)
runs="$out/runs"
mr() { "$PYTHON" -m meshrun run --runs-dir "$runs" --platform cuda --gpus-per-proc 1 -n 1 "$@"; }
$PYTHON -c 'import jax; print("jax", jax.__version__, jax.devices())'

echo "== the workers' environment"
mr --name env tests/scripts/dump_env.py && cat "$runs/env/env-0.json" && echo || exit 1

echo "== an unmodified jax.distributed script"
cat > "$out/plain.py" <<'PY'
import jax, jax.numpy as jnp
jax.distributed.initialize()
x = jnp.ones((4096, 4096), jnp.bfloat16)
print("plain:", jax.process_count(), jax.process_index(), jax.devices(), float((x @ x).sum()))
PY
mr --name plain "$out/plain.py" || exit 1

echo "== the demo GPT, 100 steps"
mr --name gpt examples/gpt.py --steps 100 --eval-every 100 --batch-size 32 --step-times "$out/steps.json" || exit 1
$PYTHON - "$out/steps.json" <<'PY'
import json, statistics, sys
times = json.load(open(sys.argv[1]))[5:]
print(f"gpu check: median step {statistics.median(times) * 1000:.2f} ms over {len(times)} steps (after 5 warm-up steps)")
PY

echo "== --memory-per-proc on the GPU: XLA's share of it, and the device's memory per rank"
mr --name limited --memory-per-proc 4GiB examples/gpt.py --size medium --steps 20 --eval-every 1000 || exit 1
$PYTHON - "$runs/limited" <<'PY'
import json, pathlib, sys
run = pathlib.Path(sys.argv[1])
env = [l for l in (run / "logs" / "rank-0.log").read_text().splitlines() if "XLA_PYTHON_CLIENT" in l]
lines = [json.loads(l) for l in (run / "memory.jsonl").read_text().splitlines()]
peaks = [m["device_peak"] for l in lines for m in l["ranks"] if m.get("device_peak")]
assert peaks, "no device memory was reported"
print(f"gpu check: device peak {max(peaks) / 2**30:.2f} GiB under a 4 GiB limit; log: {env or 'no warning'}")
assert max(peaks) <= 4 << 30, "XLA took more than the limit"
PY

echo "== 60 steps straight, and 40 + a resume from the step-40 checkpoint + 20"
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_deterministic_ops=true"
mr --name straight --checkpoint-every 20 examples/gpt.py --steps 60 --eval-every 1000 --params-digest "$out/straight.txt" || exit 1
mr --name resumed --checkpoint-every 20 examples/gpt.py --steps 40 --eval-every 1000 || exit 1
mr --name resumed --checkpoint-every 20 examples/gpt.py --steps 60 --eval-every 1000 --params-digest "$out/resumed.txt" || exit 1
if cmp -s "$out/straight.txt" "$out/resumed.txt"; then
  echo "gpu check: the resumed run's parameters equal the straight run's ($(cat "$out/straight.txt"))"
else
  echo "gpu check: the resumed run's parameters DIFFER from the straight run's"; exit 1
fi
