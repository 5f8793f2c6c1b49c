# BlockTrain's two commands, each doing its own set-up:
#   make demo   the main job: `blocktrain demo` with its defaults (a 6-peer swarm on this machine)
#   make test   the README's test command: the fast default pytest suite
# and make check (CI's lint-imports, ruff, mypy, hadolint), make clean, make distclean.
#
# Set-up, done once and reused after: a virtual environment in .venv (created when missing), torch
# (the CUDA build where `nvidia-smi` sees a GPU, else the CPU build), then the project with what the
# target needs. Stamp files in .venv record each step; a project stamp is older than pyproject.toml
# after an edit of it, and only then does pip run again, so a second `make test` starts pytest at once.
#
# Variables (make VAR=value):
#   PYTHON       the interpreter that creates .venv (python3; needs >= 3.11)
#   TORCH_CPU    pip's requirement for torch without a GPU: torch==2.13.0, the +cpu wheel where one is on
#                the indexes pip uses (e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu); from PyPI
#                alone this is the CUDA build, which runs on a CPU too
#   TORCH_CUDA   ... with a GPU: torch===2.13.0, exactly PyPI's CUDA build (never a local +cpu wheel)
#   TORCH_INDEX  the index torch comes from (default: pip's own configuration)
#   ARGS         more arguments: `make test ARGS='-k cli'`, `make demo ARGS='--peers 3 --blocks 3'`

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
TORCH_CPU ?= torch==$(TORCH_VERSION)
TORCH_CUDA ?= torch===$(TORCH_VERSION)
TORCH_INDEX ?=
ARGS ?=

PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.blocktrain

.PHONY: help demo test check clean distclean setup setup-test setup-dev

help:
	@echo "make demo       run a whole 6-peer swarm on this machine (blocktrain demo); the model goes under runs/"
	@echo "make test       run the test suite (python -m pytest: the fast default suite)"
	@echo "make check      lint-imports, ruff check, ruff format --check, mypy swarmd cli, hadolint Dockerfile"
	@echo "make clean      remove caches and build outputs (and the set-up stamps; .venv stays)"
	@echo "make distclean  clean, and remove .venv"
	@echo "each target sets up what it needs first: .venv, torch (CUDA build with a GPU, else CPU), the project"

demo: $(STAMP)-base
	$(VENV)/bin/blocktrain demo $(ARGS)

# pytest's exit code 5 (no test collected) is a failure too
test: $(STAMP)-test
	@echo "== python -m pytest $(ARGS)"
	@$(PY) -m pytest $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

check: $(STAMP)-dev
	@echo "== lint-imports (architecture contracts in pyproject.toml)"
	$(VENV)/bin/lint-imports
	@echo "== ruff check"
	$(VENV)/bin/ruff check .
	@echo "== ruff format --check"
	$(VENV)/bin/ruff format --check .
	@echo "== mypy swarmd cli"
	$(VENV)/bin/mypy swarmd cli
	@echo "== hadolint Dockerfile"
	$(VENV)/bin/hadolint Dockerfile

setup: $(STAMP)-base
setup-test: $(STAMP)-test
setup-dev: $(STAMP)-dev

# -- set-up ------------------------------------------------------------------------------------------
$(PY):
	@echo "== $(PYTHON) -m venv $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch before the project, so that the project's `torch>=2.3` is already met and pulls nothing
$(STAMP)-torch: | $(PY)
	@if nvidia-smi -L >/dev/null 2>&1; then spec='$(TORCH_CUDA)'; echo "== nvidia-smi sees a GPU: $$spec (CUDA)"; \
	else spec='$(TORCH_CPU)'; echo "== no GPU (nvidia-smi): $$spec (CPU)"; fi; \
	set -x; $(PIP) install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$$spec"
	@touch $@

# the project with the extras a target needs; a stamp of a larger set of extras, newer than
# pyproject.toml, stands for the smaller ones (after `make check`, `make test` runs no pip)
$(STAMP)-dev: pyproject.toml $(STAMP)-torch
	$(PIP) install -e '.[test,dev]'
	@touch $@

$(STAMP)-test: pyproject.toml $(STAMP)-torch
	@if [ $(STAMP)-dev -nt pyproject.toml ]; then echo "== the project is installed (with .[test,dev])"; \
	else set -x; $(PIP) install -e '.[test]'; fi
	@touch $@

$(STAMP)-base: pyproject.toml $(STAMP)-torch
	@if [ $(STAMP)-dev -nt pyproject.toml ] || [ $(STAMP)-test -nt pyproject.toml ]; then \
	echo "== the project is installed (with its test extras)"; else set -x; $(PIP) install -e .; fi
	@touch $@

# -- clean-up ----------------------------------------------------------------------------------------
clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	rm -f $(STAMP)-*

distclean: clean
	rm -rf $(VENV)
