# Quick start: `make demo` (train -> export -> run on an embedded default) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO := runs/demo

.PHONY: venv test lint typecheck unit demo bench clean

# The pinned CPU torch goes in first: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy common train export calibration edge_runtime bench

unit: venv
	$(BIN)/python -m pytest -q

test: lint typecheck unit

demo: venv
	$(BIN)/sac-train --env Pendulum-v1 --total-steps 12000 --learning-starts 1000 --eval-every 4000 --out $(DEMO) --force

bench: venv
	$(BIN)/python bench/train_speed.py

clean:
	rm -rf runs bundles .pytest_cache .mypy_cache .ruff_cache
