# Every target bootstraps .venv from nothing: a fresh clone needs only `make demo` / `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench serve lint typecheck clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/responses-lab demo

test: $(STAMP)
	$(BIN)/ruff check proto sampler tests scripts
	$(BIN)/mypy
	$(BIN)/pytest

# The latency lab's quick run (< 3 min on 2 cores; NOTES.md). The mock GPU's pacing scripts
# (scripts/gpu_pacing.py, scripts/ws_pacing.py) still run on their own.
bench: $(STAMP)
	$(BIN)/responses-lab bench --quick --out bench-out

serve: $(STAMP)
	$(BIN)/responses-lab serve

clean:
	rm -rf $(VENV) bench-out .pytest_cache .mypy_cache .ruff_cache
