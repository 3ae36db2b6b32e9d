#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU (not needed for CI): the demo
# GPT under meshrun on one GPU, --platform cuda; prints its median step time.
# Takes a few minutes: installs JAX's CUDA plugin (pinned to the lock's JAX
# version) into .venv, then trains 100 steps.
set -euo pipefail
cd "$(dirname "$0")/.."
make install
jax_version=$(.venv/bin/python -c 'import jax; print(jax.__version__)')
.venv/bin/pip install --quiet "jax[cuda12]==${jax_version}"
out=$(mktemp -d)
.venv/bin/meshrun run -n 1 --platform cuda --gpus-per-proc 1 --runs-dir "$out/runs" --name gpu-check \
  examples/gpt.py --steps 100 --eval-every 100 --batch-size 32 --step-times "$out/steps.json"
.venv/bin/python - "$out/steps.json" <<'PY'
import json, statistics, sys
times = json.load(open(sys.argv[1]))[5:]
print(f"gpu check: median step {statistics.median(times) * 1000:.1f} ms over {len(times)} steps (after 5 warm-up steps)")
PY
