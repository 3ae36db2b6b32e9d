# One Makefile; the README and CI use exactly these targets.
# `make demo` and `make test` set everything up from scratch (Rust toolchain
# and Python 3.11 are the only prerequisites) and are quick when nothing
# changed: each step is a file that is only remade when its inputs change.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-installed
BUILD_STAMP := $(VENV)/.meshrun-built
CHROMIUM_STAMP := $(VENV)/.chromium
RUST_SOURCES := $(shell find crates -name '*.rs' -o -name 'Cargo.toml') Cargo.toml $(wildcard Cargo.lock) pyproject.toml

.PHONY: help install demo test test-fast test-rust test-python test-kubeflow test-maxtext lint bench-smoke bench-all bench-startup bench-step-parity bench-recorder bench-data bench-ckpt bench-ckpt-s3 bench-recovery bench-inplace bench-vs-ray bench-hosts bench-elastic fit bench-fitting soak partition fuzz load bench-scale clean

help:  ## List the targets.
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(PY):
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] >= (3, 11), f"meshrun needs Python 3.11+, found {sys.version.split()[0]}"'
	$(PYTHON) -m venv $(VENV)

$(DEPS_STAMP): requirements.lock | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	touch $@

$(BUILD_STAMP): $(DEPS_STAMP) $(RUST_SOURCES)
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release --quiet
	touch $@

install: $(BUILD_STAMP)  ## Create .venv, install pinned dependencies, build meshrun into it.

# The browser test (tests/test_browser.py) drives a real Chromium with
# playwright. Playwright's own browser download (`playwright install`) is
# not reachable from every machine; Debian's package is, so the test uses
# that one. apt-get runs only when no chromium is on PATH (it needs root).
$(CHROMIUM_STAMP): | $(PY)
	@if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "make: the browser test needs Chromium and none is on PATH; as root run: apt-get update && apt-get install -y --no-install-recommends chromium" >&2; \
	    exit 1; \
	  fi; \
	  echo "apt-get install chromium (for the browser test)"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; \
	fi
	touch $@

demo: install  ## Set up, then run the main job: the sharded GPT on 2 processes x 2 devices (fsdp=2, tensor=2).
	$(VENV)/bin/meshrun run -n 2 --devices-per-proc 2 examples/gpt.py --fsdp 2 --tensor 2 --steps 150 --eval-every 50

# The Python suite runs its files over TEST_WORKERS processes
# (pytest-xdist, a file to a process at a time): much of it waits on
# timeouts, other processes and the network, and a file's module fixtures
# (a Ray cluster, a reference run) stay with its tests. The files go in the
# order tests/conftest.py gives them (the longest first), not xdist's
# (the most tests first). Three on 2 cores: two left the cores idle a
# fifth of the time (waits), three a little less, and the suite took
# 702 s against 766 s.
TEST_WORKERS ?= 3
PYTEST_SPREAD := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The Rust tests build in the release profile: they then share every
# dependency `make install` already compiled, instead of compiling them all
# again unoptimized.
test: install $(CHROMIUM_STAMP)  ## Set up, then run the Rust and Python test suites.
	cargo test --workspace --release --quiet
	$(VENV)/bin/pytest $(PYTEST_SPREAD)

# The Rust unit tests (--lib leaves out the controller's load test) and
# every Python test not marked `slow`: the slow ones train an example, start
# a Ray cluster, restart a run or wait out a timeout.
test-fast: install  ## Set up, then the Rust unit tests and the quick Python tests (under 2 minutes on 2 cores).
	cargo test --workspace --release --quiet --lib
	$(VENV)/bin/pytest $(PYTEST_SPREAD) -m "not slow"

test-rust:  ## Rust tests only.
	cargo test --workspace --release --quiet

test-python: install $(CHROMIUM_STAMP)  ## Python tests only.
	$(VENV)/bin/pytest $(PYTEST_SPREAD)

# Kubeflow's JAXJob examples are Kubeflow's code, not meshrun's: give the
# examples/jax folder of a kubeflow/training-operator checkout from before
# its v1 examples were removed (commit 7858371b4^).
test-kubeflow: install  ## Kubeflow's two JAX examples, unmodified, on 2 processes and on 2 namespace hosts (KUBEFLOW_EXAMPLES=<training-operator>/examples/jax).
	@test -n "$(KUBEFLOW_EXAMPLES)" || { echo "make test-kubeflow: set KUBEFLOW_EXAMPLES to the examples/jax folder of a kubeflow/training-operator checkout (commit 7858371b4^)" >&2; exit 2; }
	MESHRUN_KUBEFLOW_EXAMPLES=$(abspath $(KUBEFLOW_EXAMPLES)) $(VENV)/bin/pytest tests/test_kubeflow.py -s

# meshrun as users install it: the abi3 wheel, in venvs of other Pythons
# and JAXes. A cell is a lock file compat/py<PYTHON>-jax<JAX>.lock; its
# venv is .compat/<cell>/ (remade when the lock changes), its Python
# pyenv's or on PATH. compat/cells.py says what is missing.
.PHONY: wheel test-compat compat-short-venv

wheel: install  ## Build meshrun's abi3 wheel into dist/ (only when its sources changed).
	$(PY) compat/cells.py wheel

test-compat: install  ## The wheel in a venv per (Python, JAX) of compat/*.lock, each running tests/compat/, one after the other; prints the table.
	$(PY) compat/cells.py run

# tests/test_compat.py (in `make test`) runs the short form in one cell;
# its venv is made here, before pytest: pip reaches PyPI, tests do not.
COMPAT_SHORT_CELL := py3.12-jax0.12
compat-short-venv: install  ## Make the venv of the cell that `make test` runs the short form in.
	$(PY) compat/cells.py prepare $(COMPAT_SHORT_CELL)
test test-python: compat-short-venv

# MaxText, unmodified, under meshrun (tests/test_maxtext.py): its trainer on
# 2 processes x 2 CPU devices, uninterrupted and with a rank SIGKILLed, the
# losses compared. Its venv is Python 3.12 with exactly the pins of
# compat/maxtext/requirements.lock (made again when they change) and
# meshrun's wheel; `make test` runs the short form when the venv is there.
MAXTEXT_VENV := .compat/maxtext-py3.12
MAXTEXT_PYTHON ?= $(or $(lastword $(sort $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12.*/bin/python3.12))),$(shell command -v python3.12))

$(MAXTEXT_VENV)/.deps-installed: compat/maxtext/requirements.lock
	@test -n "$(MAXTEXT_PYTHON)" || { echo "make test-maxtext: MaxText needs Python 3.12 and none was found (pyenv install 3.12, or MAXTEXT_PYTHON=/path/to/python3.12)" >&2; exit 2; }
	rm -rf $(MAXTEXT_VENV)
	$(MAXTEXT_PYTHON) -m venv $(MAXTEXT_VENV)
	$(MAXTEXT_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -r compat/maxtext/requirements.lock
	touch $@

test-maxtext: wheel $(MAXTEXT_VENV)/.deps-installed  ## MaxText's trainer under meshrun, a rank SIGKILLed after its first checkpoint: it resumes from its own checkpoint with the uninterrupted run's losses.
	$(MAXTEXT_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --force-reinstall $$(ls -t dist/meshrun-*-abi3-*.whl | head -1)
	MESHRUN_MAXTEXT_FULL=1 $(VENV)/bin/pytest tests/test_maxtext.py -s

# The Python checks take their settings from pyproject.toml; stubtest
# compares python/meshrun/_native.pyi with the built native module.
lint: install  ## rustfmt, clippy; ruff, mypy and stubtest on the Python package.
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python/meshrun
	$(VENV)/bin/mypy
	$(PY) -m mypy.stubtest --mypy-config-file pyproject.toml meshrun._native

# The benchmarks' short forms (tests/test_benches.py): each script run small,
# so it keeps working; the figures come from the bench-* targets below.
# The fuzz target is a workspace of its own that nothing else builds: the
# check keeps it compiling as the crates it fuzzes change.
bench-smoke: install  ## The benchmark scripts run small (pytest --bench-smoke) and the fuzz target compiled (cargo check); CI runs it after make test.
	cargo check --quiet --manifest-path fuzz/Cargo.toml
	$(VENV)/bin/pytest --bench-smoke

BENCHMARKS := bench-startup bench-step-parity bench-recorder bench-data bench-ckpt bench-ckpt-s3 bench-recovery bench-inplace bench-vs-ray bench-hosts bench-elastic bench-fitting bench-scale

bench-all: install  ## Every benchmark of docs/benchmarks.md, one after another, on a quiet machine (the Python ones print the date, commit and load they ran at, and keep them in their JSON in bench/out/).
	$(MAKE) $(BENCHMARKS)

bench-startup: install  ## Startup overhead of `meshrun run` against a hand launch.
	$(PY) bench/startup.py

bench-step-parity: install  ## Demo GPT step time under `meshrun run` against a hand launch.
	$(PY) bench/step_parity.py

bench-recorder: install  ## The flight recorder's cost: the demo GPT's step time with it on and off (MESHRUN_RECORDER=0).
	$(PY) bench/recorder.py --rounds 3 --json bench/out/recorder.json

bench-data: install  ## Loader throughput against numpy memmap, Grain and Ray Data (writes a 1 GB file under bench/out).
	$(PY) bench/data.py --json bench/out/data.json

bench-ckpt: install  ## Checkpoint save/restore of a 1 GiB sharded pytree against Orbax, and the disk's fsync bandwidth.
	$(PY) bench/ckpt.py --rounds 5 --json bench/out/ckpt.json

bench-ckpt-s3: install  ## Checkpoint save/restore of a 1 GiB sharded pytree in S3 (a SeaweedFS server on loopback) against TensorStore's s3 kvstore, and the raw object bandwidth.
	$(PY) bench/ckpt_s3.py --rounds 3 --json bench/out/ckpt_s3.json

bench-recovery: install  ## SIGKILL of one GPT worker to the first step after the automatic restart: from storage with new interpreters, against memory checkpoints with warm spares, compiling or loading the first attempt's executables.
	$(PY) bench/recovery.py --rounds 3 --json bench/out/recovery.json

bench-inplace: install  ## What JAX's fault-tolerance mode does on CPU when one of three processes is killed: survivors going on alone, and a replacement under the dead id (every JAX of the compat cells that is built).
	$(PY) bench/inplace.py --rounds 3 --python $(VENV)/bin/python $(wildcard .compat/py3.12-jax0.11/bin/python .compat/py3.12-jax0.12/bin/python) --json bench/out/inplace.json

bench-vs-ray: install  ## meshrun (local and on Ray) against Ray Train's JaxTrainer on one Ray cluster, and the cost of a report call.
	$(PY) bench/vs_ray.py --rounds 3 --json bench/out/vs_ray.json

bench-hosts: install  ## Demo GPT step time on 2 hosts that share nothing (network namespaces, needs root) against 2 loopback hosts.
	$(PY) bench/hosts.py --rounds 3 --json bench/out/hosts.json

bench-elastic: install  ## The GPT on 4 namespace hosts (needs root): a host lost for good to the first step on 2, and its return to the first step on 4, beside a plain restart.
	$(PY) bench/elastic.py --rounds 3 --json bench/out/elastic.json

partition: install  ## The GPT on 2 namespace hosts, host 1 cut off for 10 s after its first checkpoint, at full length: bit-identical to one host (the suite runs a short one).
	MESHRUN_PARTITION_STEPS=150 $(VENV)/bin/pytest tests/test_hosts_apart.py -k mid_training -s --timeout 3600

fit: install  ## The large GPT (152M parameters, 1.70 GiB with Adam) under --memory-per-proc 2GiB: out of memory on one worker, 5 steps on four with fsdp=4 with one unlimited worker's losses, the planner's peaks within 25% (make bench-smoke runs the medium one for 2 steps).
	MESHRUN_FIT_SIZE=large MESHRUN_FIT_STEPS=5 $(VENV)/bin/pytest --bench-smoke tests/test_fitting.py -s --timeout 3600

bench-fitting: install  ## The planner's predicted peak per device against the measured one: the medium and large GPT on one worker, on data=2 x fsdp=2 and on fsdp=4.
	$(PY) bench/fitting.py --json bench/out/fitting.json

soak: install  ## The GPT killed with SIGKILL at 10 random moments, with durable checkpoints and with memory checkpoints every step, must end bit-identical to an uninterrupted run (make bench-smoke runs 2 kills of each); then 20 SIGKILLs of a worker or the controller in the middle of saves (make bench-smoke runs 4).
	MESHRUN_SOAK_KILLS=10 MESHRUN_SOAK_STEPS=200 $(VENV)/bin/pytest tests/test_recovery.py -k soak --bench-smoke -s --timeout 3600
	MESHRUN_KILL_ROUNDS=20 $(VENV)/bin/pytest tests/test_checkpoint.py -k sigkill_at_random_points --bench-smoke -s --timeout 3600

load:  ## 64 fake workers x 1,000 records/s for 60 s through the controller: records lost (0) and its peak memory.
	MESHRUN_LOAD_SECONDS=60 cargo test --release -q -p meshrun-loadtest -- --nocapture

bench-scale:  ## The controller at 64 to 10,000 ranks (fake hosts and workers as tasks, real protocol): the table of join, failure to stop, restart, commit, CPU, memory, records lost (the suite runs 1,024).
	MESHRUN_SCALE_RANKS=$(SCALE_RANKS) MESHRUN_SCALE_REPEAT=$(SCALE_REPEAT) cargo test --release -q -p meshrun-loadtest --test scale -- --nocapture

SCALE_RANKS ?= 64,256,1024,4096,10000
SCALE_REPEAT ?= 3

FUZZ_SECONDS ?= 600

fuzz:  ## Fuzz the control protocol's frame decoder for FUZZ_SECONDS (600) with cargo fuzz; prints runs and crashes.
	@command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run frame --sanitizer none -- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1

clean:  ## Remove build outputs and the virtualenv.
	rm -rf $(VENV) target .compat dist
