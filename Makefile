# loom: `make` builds build/loom (portable x86-64; `make NATIVE=1`: -march=native); `make run` and `make test` also install what is missing.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all build run test setup setup-test bench clean

all: build

# NATIVE=1: -march=native (runs only on CPUs like this one); default: portable x86-64 with
# run-time kernel dispatch (docs/build.md).
NATIVE ?=
# TESTS: AUTO builds the tests when their packages are installed, ON requires them (make test),
# OFF leaves them out. TARGET: what to build (all: loom, loom-asan, the tests; make run: loom).
TESTS ?= AUTO
TARGET ?= all
CONFIGURE = cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DLOOM_TESTS=$(TESTS) \
	-DLOOM_NATIVE=$(if $(filter 1 ON on yes,$(NATIVE)),ON,OFF) >/dev/null
build:
	@$(CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS) --target $(TARGET)

setup:
	@bash scripts/setup.sh

setup-test:
	@bash scripts/setup.sh --test

# Train the default model on the default data for a few minutes, then sample from it.
# Needs only what `scripts/setup.sh` installs (no test packages): the loom binary alone.
run: setup
	@$(MAKE) --no-print-directory build TARGET=loom
	@LOOM=$(BUILD)/loom bash scripts/run_default.sh

# LOOM_TEST_SKIP=cat,... (unit reference e2e mpi slurm fuzz) is the only way to skip tests.
# A fresh build gets CTest's cost data from tests/ctest-costs.txt (seconds per test, measured):
# CTest then starts the longest tests first instead of in file order.
test: setup-test
	@$(MAKE) --no-print-directory build TESTS=ON
	@mkdir -p $(BUILD)/Testing/Temporary && [ -f $(BUILD)/Testing/Temporary/CTestCostData.txt ] || \
	  cp tests/ctest-costs.txt $(BUILD)/Testing/Temporary/CTestCostData.txt
	@cd $(BUILD) && ctest --output-on-failure -j 2
	@if [ -n "$$LOOM_TEST_SKIP" ]; then echo "make test: LOOM_TEST_SKIP=$$LOOM_TEST_SKIP: the tests listed as (Skipped) did not run (fully)"; fi
	@$(BUILD)/loom version | sed -n 's/^cuda: no device: /make test: the gpu\/* tests (Skipped) need a GPU: /p'
	@$(BUILD)/loom version | grep -q '^cuda:' || echo "make test: the gpu/* tests (Skipped) need the CUDA backend: this build has none (nvcc not found)"

bench: setup-test
	@$(MAKE) --no-print-directory build TESTS=ON
	@python3 bench/bench_train.py

clean:
	rm -rf $(BUILD)
