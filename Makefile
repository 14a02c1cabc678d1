# refcg: every target creates .venv (python3.11) if missing and installs the project into it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.refcg-installed
SOURCES := pyproject.toml $(wildcard refcodegen/*.py refcodegen/ops/*.py templates/* runtime/* runtime/include/*)
export TOPHUB_LOCATION := NONE

.PHONY: demo test test-slow test-networks test-zoo test-arm bench bench-networks fuzz fuzz-arm fuzz-large install clean

# tools/ run from the repository root as modules: examples/ (the example models, not in the wheel)
# imports from the checkout
demo: $(STAMP)
	$(BIN)/python -m tools.demo

# tests run against the installed package (no source tree first on sys.path; conftest.py appends the
# checkout for examples/)
# --durations: the slowest tests in the log, to keep make test under 20 minutes on 2 cores
test: $(STAMP)
	$(ARM_SETUP) || [ $$? -eq $(ARM_UNAVAILABLE) ]
	cd tests && ../$(BIN)/python -c "import refcodegen as r; assert 'site-packages' in r.__file__, r.__file__"
	cd tests && ../$(BIN)/pytest -q -n auto --maxprocesses=4 -m "not network and not zoo and not slow" --durations=15

# What keeps make test under 20 minutes on 2 cores: the fuzz harness, the sanitizer builds, more
# numerics variants of the boundary sweeps, the cortex-a53 rounding rule, the profiler build (its own core
# compile), tvmc on an ONNX QDQ model (tvmc's export compiles the core), the x86 `make -C runtime check`
# (tests marked slow); CI runs it.
test-slow: $(STAMP)
	$(ARM_SETUP) || [ $$? -eq $(ARM_UNAVAILABLE) ]
	cd tests && ../$(BIN)/pytest -q -n auto --maxprocesses=4 -m slow

# Whole real networks (Inception-v3 ...): minutes each, so not in `make test`; CI runs both.
test-networks: $(STAMP)
	cd tests && ../$(BIN)/pytest -q -m network

# The zoo networks too heavy for make test (examples/zoo.py; tests/test_zoo.py): ~25 min of both cores.
test-zoo: $(STAMP)
	cd tests && ../$(BIN)/pytest -q -s -n 2 -m zoo

# The emulated aarch64 host (cross compilers, qemu-user, an aarch64 python+TVM sysroot):
# idempotent, 10 ms once done. `make test` runs it before pytest collects the ARM tests and
# goes on without them only where it cannot install (exit 3: no apt or not root).
ARM_SETUP := PYTHON=$(BIN)/python bash tools/arm/setup.sh
ARM_UNAVAILABLE := 3
ARM_TESTS := test_arm_models.py test_arm_numerics.py test_core_arm.py

test-arm: $(STAMP)
	$(ARM_SETUP)
	cd tests && ../$(BIN)/pytest -q $(ARM_TESTS)

# the bench extra (onnx, onnxruntime) on top of the test install, once
BENCH_STAMP := $(VENV)/.refcg-bench
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-build-isolation ".[bench]"
	rm -rf build
	touch $@

bench: $(BENCH_STAMP)
	$(BIN)/python -m tools.bench

# The zoo (examples/zoo.py) at real input sizes vs PyTorch fbgemm, LiteRT, ONNX Runtime: a build per
# network and target, so apart from `make bench` (BENCH_ARGS="--networks resnet18 --threads 1")
BENCH_ARGS ?= --networks
bench-networks: $(BENCH_STAMP)
	$(BIN)/python -m tools.bench $(BENCH_ARGS)

# Random QNN chains against TVM-only, 20 per build, one process per core (tests/fuzzing;
# e.g. FUZZ_ARGS="--cases 2000 --seed 3 --jobs 2"); fuzz-arm: the same for aarch64 (+neon,+dotprod on
# QEMU max, +neon on cortex-a53) against TVM-only aarch64, run on the emulated host;
# fuzz-large: codegen/export time and peak memory for a ResNet-50-sized weight set (~1 min).
FUZZ_ARGS ?= --cases 10000 --batch 20
FUZZ_ARM_ARGS ?= --cases 1000 --batch 20
fuzz: $(STAMP)
	cd tests && ../$(BIN)/python -m fuzzing $(FUZZ_ARGS)

fuzz-arm: $(STAMP)
	$(ARM_SETUP)
	cd tests && ../$(BIN)/python -m fuzzing --arm $(FUZZ_ARM_ARGS)

fuzz-large: $(STAMP)
	cd tests && ../$(BIN)/python -m fuzzing --large-constants

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=23" setuptools wheel

# First install pulls dependencies; later ones only rebuild refcodegen (non-editable: tests
# import the installed package, templates/ and runtime/ included).
$(STAMP): $(BIN)/python $(SOURCES)
	$(BIN)/pip install -q --no-build-isolation ".[test,onnx,torch,tflite,tflite-models]"
	rm -rf build
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
