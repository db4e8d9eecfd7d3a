# deepinit: set-up, tests, benchmarks and reproductions.
#   make setup   create .venv and install deepinit (editable) with its dev extras
#   make test    run the test suite (CPU)
# TORCH selects the PyTorch requirement installed first. Users keep the default (their own
# build, e.g. a CUDA wheel, is left alone if already present); CI pins the local CPU build:
#   make setup TORCH=torch==2.13.0
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup test test-fast train bench clean help

help:
	@sed -n '2,8p' Makefile

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

setup: $(BIN)/python
	$(BIN)/python -m pip install "$(TORCH)"
	# compat editable mode: Hydra's plugin scan must see hydra_plugins/ (the local launcher)
	$(BIN)/python -m pip install -e ".[dev]" --config-settings editable_mode=compat

test:
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast:
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "not slow and not slurm" $(PYTEST_ARGS)

train:
	$(BIN)/deepinit train

clean:
	rm -rf build dist *.egg-info .pytest_cache
