# deepinit: set-up, tests, benchmarks and reproductions (make help prints this list).
#   make setup              create .venv and install deepinit (editable) with its dev extras
#   make train              the default run (built-in toy task, CPU-sized model)
#   make test               the test suite on every core, one process more (JOBS=N: N processes; CUDA checks run if a GPU is visible)
#   make test-fast          the test suite without the slow and SLURM tests
#   make test-cuda          only the CUDA checks (tests/test_cuda.py)
#   make bench              training/decoding throughput, MFU, depth scaling (docs/performance.md)
#   make bench-peer PEER_TOOLS=DIR   the same side by side with fairseq (DIR: the peer scripts)
#   make reproduce-TARGET   a published table, e.g. reproduce-table2 [SCALE=cpu|real|gpu|paper]
#                           (deepinit reproduce list: the targets; docs/reproductions.md)
#   make reproduce-all      every real-data suite's missing cells in one pool (many hours on CPU)
#   make reproduce-all-schemes  one table of every scheme at the deep setting, from results/
#   make example-multi30k   a small model on Multi30k De->En on CPU, scored on test2016
#   make clean              remove build outputs (build, dist, *.egg-info, .pytest_cache)
#   (all but clean run make setup first if needed)
# TORCH selects the PyTorch requirement installed first into the new .venv: by default the
# version the tests run on (PyPI serves it with CUDA on Linux x86-64; a CPU-only machine may
# have a local CPU build of it). Another build: make setup TORCH=torch==X.Y.Z (or a wheel's path)
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The test suite runs on every CPU core through pytest-xdist (a dev extra), with one worker more
# than there are cores: the end-to-end tests spend part of their time waiting on their child
# processes, SLURM and the disk, which the extra worker fills (2 cores, two niced training runs
# beside: 500, 505 and 572 s against 544, 557 and 559 s with one worker per core, alternating;
# 556 s with two extra; all passing: a median 9% faster, though not in every pair).
# JOBS=N: N processes, JOBS=1 one; --dist loadgroup keeps the tests of one xdist_group (the SLURM
# tests: one queue) on one worker.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1); echo $$((n + 1)))
XDIST = $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadgroup)

.PHONY: setup test test-fast test-cuda train clean help

help:
	@sed -n '2,14s/^# //p' Makefile

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

INSTALLED := $(VENV)/.deepinit-installed

$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install "$(TORCH)"
	# compat editable mode: Hydra's plugin scan must see hydra_plugins/ (the local launcher)
	$(BIN)/python -m pip install -e ".[dev]" --config-settings editable_mode=compat
	touch $(INSTALLED)

setup: $(INSTALLED)

# Real corpora for the tests (multi30k/, iwslt14-de-en-fairseq/, tinyshakespeare/) are read from $DEEPINIT_DATA_ROOT
# (make test DATA_ROOT=PATH sets it); tests whose corpus is missing skip and say where they looked.
DATA_ROOT ?= $(DEEPINIT_DATA_ROOT)
DATA_ENV = $(if $(DATA_ROOT),DEEPINIT_DATA_ROOT="$(abspath $(DATA_ROOT))")

# Bytecode caching on (PYTHONDONTWRITEBYTECODE cleared; __pycache__ is ignored by git): without
# it every pytest worker rewrites and compiles every test module again (~4 s of collection each)
# and every command a test starts compiles deepinit's modules again.
PYTEST_ENV = OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE= $(DATA_ENV)

test: $(INSTALLED)
	$(PYTEST_ENV) $(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: $(INSTALLED)
	$(PYTEST_ENV) $(BIN)/python -m pytest -m "not slow and not slurm" $(XDIST) $(PYTEST_ARGS)

# The CUDA checks (tests/test_cuda.py; they skip without a GPU): bf16/fp16 steps, fused Adam,
# SDPA kernels, torch.compile, resume, beam search against the CPU's.
test-cuda: $(INSTALLED)
	$(DATA_ENV) $(BIN)/python -m pytest -m cuda -v -s tests/test_cuda.py $(PYTEST_ARGS)

train: $(INSTALLED)
	$(BIN)/deepinit train

clean:
	rm -rf build dist *.egg-info .pytest_cache

# A real result on CPU: a 256-512-4, 3+3-layer Pre-LN model on Multi30k De->En,
# sized for a 2-core CPU (1,600 updates of 4,096 tokens, about 13 epochs), then
# beam-5 tokenized BLEU on test2016 with the last 5 checkpoints averaged (result.json and eval/
# in the run folder).
.PHONY: example-multi30k
example-multi30k: $(INSTALLED)
	$(BIN)/deepinit train data=multi30k model=small model.dim=256 model.ffn_dim=512 model.heads=4 \
	  model.layers=3 norm=pre model.dropout=0.1 model.attention_dropout=0.1 optim.lr=1e-3 \
	  optim.weight_decay=1e-4 warmup.updates=400 trainer.max_updates=1600 trainer.valid_interval=200 \
	  trainer.save_interval=200 trainer.keep_checkpoints=5 trainer.final_bleu=true \
	  trainer.eval_average_last=5 hydra.run.dir=outputs/examples/multi30k

# Benchmarks (docs/performance.md). BENCH_ARGS passes options and overrides to deepinit bench,
# e.g. make bench BENCH_ARGS="--presets small --depths"; THREADS sets torch's CPU threads.
.PHONY: bench bench-peer
THREADS ?= 0
PEER_TOOLS ?=  # the folder of peer_setup.sh and peer_train_bench.sh (the fairseq peer)
BENCH_ARGS ?=

bench: $(INSTALLED)
	$(BIN)/deepinit bench --threads $(THREADS) $(BENCH_ARGS)

# Needs PEER_TOOLS=DIR, the fairseq peer scripts (peer_setup.sh, peer_train_bench.sh; not in this
# repository): fairseq in its own venv outside the repo (the first run builds it), then both
# alternating.
bench-peer: $(INSTALLED)
	@test -n "$(PEER_TOOLS)" || { echo "make bench-peer needs PEER_TOOLS=DIR (the folder of peer_setup.sh)" >&2; exit 2; }
	bash $(PEER_TOOLS)/peer_setup.sh
	$(BIN)/deepinit bench --peer --threads $(if $(filter 0,$(THREADS)),2,$(THREADS)) --peer-tools $(PEER_TOOLS) $(BENCH_ARGS)

# One command per published table (deepinit reproduce, docs/reproductions.md):
#   make reproduce-table2 [SCALE=cpu|real|gpu|paper] [LAUNCHER=basic|local|slurm] [DRY_RUN=1] [REPRODUCE_ARGS="overrides"]
# SCALE defaults to paper when a GPU is visible, else cpu; real for targets that have only a real
# tier. Runs land in
# outputs/reproduce/<target>-<scale>/; a second call runs only the unfinished cells.
SCALE ?=
LAUNCHER ?=
DRY_RUN ?=
REPRODUCE_ARGS ?=
REPRODUCE_TARGETS := reproduce-table2 reproduce-grid reproduce-tfixup-depth reproduce-lipschitz \
                     reproduce-schemes-postln reproduce-sgd-control reproduce-schemes-other \
                     reproduce-schemes-norms reproduce-schemes-scaling reproduce-schemes-norms-warmup \
                     reproduce-schemes-scaling-warmup reproduce-mup-transfer reproduce-width \
                     reproduce-table2-converged reproduce-all reproduce-all-schemes
.PHONY: $(REPRODUCE_TARGETS)
$(REPRODUCE_TARGETS): $(INSTALLED)
	$(BIN)/deepinit reproduce $(@:reproduce-%=%) $(if $(SCALE),--scale $(SCALE)) $(if $(LAUNCHER),--launcher $(LAUNCHER)) $(if $(DRY_RUN),--dry-run) $(REPRODUCE_ARGS)
