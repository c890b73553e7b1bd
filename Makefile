# Quick start: `make demo` (train -> export -> run on an embedded default) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO := runs/demo
# Every demo output lies under runs/ (ignored by git, ruff, mypy and pytest): nothing it writes may change
# what `make test` sees (tests/test_clean_clone.py checks this recipe).
DEMO_BUNDLE := runs/demo-bundle

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

# Train Pendulum-v1 briefly, export with the INT8 gate, run 10 s on the device path with budgets, bench,
# then fine-tune on a shifted Pendulum (stronger gravity) while the loop keeps running.
demo: venv
	$(BIN)/sac-train --env Pendulum-v1 --total-steps 12000 --learning-starts 2000 --eval-every 4000 --out $(DEMO) --force
	$(BIN)/sac-export $(DEMO) --out $(DEMO_BUNDLE) --int8 --force
	$(BIN)/sac-edge run $(DEMO_BUNDLE) --rate-hz 200 --duration 10 --mem-budget-mb 400 --power-budget-w 15 --telemetry runs/demo-telemetry.jsonl
	$(BIN)/sac-edge bench $(DEMO_BUNDLE) --batch 1,8,64 --out runs/demo-bench.json --plot runs/demo-bench.png
	$(BIN)/sac-edge run $(DEMO_BUNDLE) --finetune --shift g=13 --rate-hz 100 --duration 45 --telemetry runs/demo-finetune.jsonl

bench: venv
	$(BIN)/python bench/train_speed.py
	$(BIN)/python bench/default_speed.py
	$(BIN)/python bench/export_quality.py
	$(BIN)/python bench/edge_loop.py

clean:
	rm -rf runs bundles .pytest_cache .mypy_cache .ruff_cache
