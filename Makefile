# Every target bootstraps .venv from nothing: a fresh clone needs only `make demo` / `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench serve lint typecheck clean postgres

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/responses-lab demo

# The suite starts its own throwaway PostgreSQL (tests/databases.py) from Debian's package; a machine
# without it gets it here (as root; elsewhere the PostgreSQL tests fail and say what to install).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15; } || \
	  echo "postgresql-15 is not installed and could not be: the PostgreSQL tests will fail (apt-get install postgresql-15)"

test: $(STAMP) postgres
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
