# The two set-up commands of the README. Both create .venv on first use; `make test` also .venv-skyrl and .venv-py310.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# SkyRL 0.4.0 requires Python >= 3.12: its integration is installed and tested in a second environment.
# No CPU wheel of torch for 3.12 lies on disk here, so by default pip takes PyPI's (a CUDA build that runs on the CPU).
# pyenv's 3.12 when present (its shim answers only where 3.12 is the active version), else python3.12.
PY312 ?= $(firstword $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/3.12*/bin/python3.12) python3.12)
SKYRL_BIN := .venv-skyrl/bin
# verl-agent's WebShop environment needs Python 3.10: oma's core, hosts, verl-agent integration and audit are tested
# there in a third environment, with only what they import (oma itself --no-deps, so no transformers). No CPU wheel of
# torch for 3.10 lies on disk here either, so by default that one too is PyPI's CUDA build.
PY310 ?= $(firstword $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/3.10*/bin/python3.10) python3.10)
PY310_BIN := .venv-py310/bin
# torch is installed first, pinned, so that the rest keeps it. Where it comes from: TORCH_INDEX, pip's --index-url
# for that one install. Empty (the default): pip's default index, which on this project's machines holds a CPU wheel
# of torch 2.13.0 for Python 3.11 and elsewhere, on Linux, is PyPI's CUDA build (several GB). For the CPU build on
# any machine: make train TORCH_INDEX=https://download.pytorch.org/whl/cpu (docs/install.md).
TORCH_PIN := torch==2.13.0
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

# constraints.txt: fixed transformers and tokenizers, the versions the figures since 2026-12-02 were measured with.
$(BIN)/oma-installed: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_FROM) "$(TORCH_PIN)"
	$(BIN)/pip install -q -e ".[dev,docs,verl,textworld,scienceworld,alfworld]" "$(TORCH_PIN)" -c constraints.txt
	touch $@

$(SKYRL_BIN)/oma-installed: pyproject.toml
	@$(PY312) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || { echo "make: no Python >= 3.12 at '$(PY312)'; SkyRL 0.4.0 needs one (make PY312=/path/to/python3.12)"; exit 1; }
	$(PY312) -m venv .venv-skyrl
	$(SKYRL_BIN)/pip install -q --upgrade pip
	$(SKYRL_BIN)/pip install -q $(TORCH_FROM) "$(TORCH_PIN)"
	$(SKYRL_BIN)/pip install -q -e ".[dev,skyrl]" "$(TORCH_PIN)"
	touch $@

# The versions' floors are pyproject.toml's; rich and matplotlib because `oma audit` prints tables and draws PNGs.
$(PY310_BIN)/oma-installed: pyproject.toml
	@$(PY310) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null || { echo "make: no Python 3.10 at '$(PY310)'; the 3.10 tests need one (make PY310=/path/to/python3.10)"; exit 1; }
	$(PY310) -m venv .venv-py310
	$(PY310_BIN)/pip install -q --upgrade pip
	$(PY310_BIN)/pip install -q $(TORCH_FROM) "$(TORCH_PIN)"
	$(PY310_BIN)/pip install -q "$(TORCH_PIN)" "numpy>=1.26" "pyarrow>=15" "omegaconf>=2.3" "rich>=13" "matplotlib>=3.8" "pytest>=8" "hypothesis>=6.100"
	$(PY310_BIN)/pip install -q --no-deps -e .
	touch $@

.PHONY: install test train
install: $(BIN)/oma-installed $(SKYRL_BIN)/oma-installed $(PY310_BIN)/oma-installed

# Three environments: the main suite, the tests against SkyRL itself (tests/with_skyrl), then on Python 3.10 the
# test files that tests/conftest.py's PY310_MODULES names (what the 3.10 parts must pass there).
test: install
	OMA_TESTS_NEED_VERL=1 $(BIN)/python -m pytest -q --hypothesis-profile=ci
	OMA_TESTS_NEED_SKYRL=1 $(SKYRL_BIN)/python -m pytest -q --hypothesis-profile=ci tests/with_skyrl
	OMA_TESTS_PY310=1 $(PY310_BIN)/python -m pytest -q --hypothesis-profile=ci

# The default job (`oma train` with no arguments = configs/household-gigpo-oma.yaml): household, GiGPO with
# OA + MA, tiny model, warm start included (cached after the first run).
train: $(BIN)/oma-installed
	$(BIN)/oma train
