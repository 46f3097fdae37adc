# loom: `make` builds build/loom (portable x86-64; `make NATIVE=1`: -march=native); `make run` and `make test` also install what is missing.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all build run test setup setup-test bench clean

all: build

# NATIVE=1: -march=native (runs only on CPUs like this one); default: portable x86-64 with
# run-time kernel dispatch (docs/build.md).
NATIVE ?=
build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DLOOM_NATIVE=$(if $(filter 1 ON on yes,$(NATIVE)),ON,OFF) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

setup:
	@bash scripts/setup.sh

setup-test:
	@bash scripts/setup.sh --test

# Train the default model on the default data for a few minutes, then sample from it.
run: setup build
	@bash scripts/run_default.sh

# LOOM_TEST_SKIP=cat,... (unit reference e2e mpi slurm fuzz) is the only way to skip tests.
test: setup-test build
	@cd $(BUILD) && ctest --output-on-failure -j 2
	@if [ -n "$$LOOM_TEST_SKIP" ]; then echo "make test: LOOM_TEST_SKIP=$$LOOM_TEST_SKIP: the tests listed as (Skipped) did not run (fully)"; fi

bench: setup-test build
	@python3 bench/bench_train.py

clean:
	rm -rf $(BUILD)
