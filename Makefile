# The two set-up commands of the README. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU wheel of torch lies on local disk here; pinning it first keeps pip from pulling a CUDA build.
TORCH_PIN := torch==2.13.0

$(BIN)/oma-installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e ".[dev,verl,textworld,scienceworld,alfworld]" "$(TORCH_PIN)"
	touch $@

.PHONY: install test train
install: $(BIN)/oma-installed

test: install
	OMA_TESTS_NEED_VERL=1 $(BIN)/python -m pytest -q

# The default job (`oma train` with no arguments = configs/household-gigpo-oma.yaml): household, GiGPO with
# OA + MA, tiny model, warm start included (cached after the first run).
train: install
	$(BIN)/oma train
