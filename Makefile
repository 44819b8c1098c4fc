# Two commands do all set-up on a fresh machine:  make book  and  make test.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BUILD := _build
# `make reproduce`: measure what `make gpu-plan` lists as missing (on a GPU), then render the book from it.
# REPEATS: independent repeats per study part (fresh processes, seeds base+r).
REPEATS ?= 3
# GPUS: the GPUs of the machine a plan is for; the Beyond-one-GPU page's jobs that need more are held back.
GPUS ?= 1
# STUDIES: plan only these studies (slugs); with REPEATS=6, a re-run of a study beside its campaign's three repeats,
# which the methodology page's re-run check judges on their own (servelab.studies.common.rerun_check)
STUDIES ?=
# TEST_WORKERS: pytest-xdist processes for the CPU tests, one a core of CI's two-core machine (there the library
# tests took 13 min in one process and 5.6 min in two). --dist loadfile keeps a file's tests in one worker: its
# module fixtures (built engines, servers) are built once, and a notebook's cells run in order in one kernel.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile


.PHONY: venv lint pages book test test-lib test-pages test-notebooks test-book browser gpu-plan prune-runs reproduce clean \
	gpu-test-quick gpu-test

venv: $(STAMP)
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

# Render every study page and the simulator page from the committed data (papermill, profile "replay": nothing
# is measured, on a CPU), then build the book. --all: a full build every time, so that changed static files and
# data includes are never stale.
pages: $(STAMP)
	$(PY) -m servelab_book render

book: pages
	$(PY) -m servelab_book prepare --root .
	$(VENV)/bin/jupyter-book build . --all --builder html -W -n --keep-going
	@echo "The book: $(CURDIR)/$(BUILD)/html/index.html"

# The GPU jobs missing at today's measurement fingerprints, with expected minutes, packed into GPU runs
# (run each with scripts/gpu_run.sh on the GPU machine).
gpu-plan: $(STAMP)
	@$(PY) -m servelab.studies.common.campaign plan --repeats $(REPEATS) --gpus $(GPUS) $(STUDIES)

# Take out of the tree the runs at older fingerprints that a study's complete repeats at today's supersede (git
# history keeps them): every GPU call carries the tree within 64 MiB. Lists them; APPLY=1 removes them.
prune-runs: $(STAMP)
	@$(PY) -m servelab.studies.common.prune $(if $(APPLY),--apply,)

# ruff: lint and format, configured in pyproject.toml; any finding fails.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint test-lib test-pages test-notebooks test-book

# SERVELAB_SLOW_TESTS: the tests that spawn a fresh interpreter or compile on a CPU (about 80 s on 2 cores) skip in a
# bare pytest run, for a quick loop; here they run, so that no test is one that never runs anywhere.
test-lib: $(STAMP)
	SERVELAB_SLOW_TESTS=1 $(PY) -m pytest -q $(XDIST) tests || [ $$? -eq 5 ]

# The committed pages are renders of the committed data by today's reporting code: nbval renders each again and
# fails on any difference (before `make book` renders them anew). Volatile fields: tests/nbval_sanitize.cfg.
test-pages: $(STAMP)
	$(PY) -m pytest -q $(XDIST) --nbval -p no:cacheprovider --nbval-sanitize-with tests/nbval_sanitize.cfg \
	  book/studies/*.ipynb book/simulator.ipynb

# Every study notebook in the smoke profile (profile="auto" picks it without CUDA), writing to scratch.
test-notebooks: $(STAMP)
	SERVELAB_RESULTS=$$(mktemp -d) $(PY) -m pytest -q $(XDIST) --nbval-lax -p no:cacheprovider notebooks || [ $$? -eq 5 ]

# The GPU tests in two tiers (README, "GPU tests in two tiers"), on a CUDA device: gpu-test-quick runs the tests
# marked gpu_quick (token-exactness of every captured path at cheap shapes; meant to take under 3 minutes on the
# H200), gpu-test every test marked gpu (the quick ones too). Neither needs the venv: GPU_PY is the venv's python
# where there is one, else python3 (the H200 machine's has torch and pytest). Only the files that mark tests gpu
# are collected: the rest of tests/ imports packages that machine lacks (tests/test_gpu_tiers.py checks both).
# --durations: every phase of 0.5 s or more, slowest first, so each run records where the time went.
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_TEST_FILES = $(shell grep -l 'pytest\.mark\.gpu' tests/test_*.py)
GPU_PYTEST = PYTHONPATH=lib$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m pytest -q -p no:cacheprovider --durations=0 \
	--durations-min=0.5
NEEDS_CUDA = $(GPU_PY) -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' \
	|| { echo "$@: no CUDA device here (the tests would all skip)" >&2; exit 1; }

gpu-test-quick:
	@$(NEEDS_CUDA)
	$(GPU_PYTEST) -m gpu_quick $(GPU_TEST_FILES)

gpu-test:
	@$(NEEDS_CUDA)
	$(GPU_PYTEST) -m gpu $(GPU_TEST_FILES)

# Check the built book, then open every page in headless Chromium (screenshots: tests/_artifacts/).
test-book: book browser
	$(PY) -m servelab_book check $(BUILD)/html
	SERVELAB_BOOK_HTML=$(BUILD)/html $(PY) -m pytest -q -p no:cacheprovider tests/browser

# Debian's chromium and its driver, for the browser test; skipped where they are installed.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then echo "chromium: $$(/usr/bin/chromedriver --version)"; \
	else apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; fi

# Measure, on a GPU, every job `make gpu-plan` lists (each a fresh process), then render the book from the data.
reproduce: $(STAMP)
	$(PY) -m servelab.studies.common.campaign run $$($(PY) -m servelab.studies.common.campaign plan --jobs-only --repeats $(REPEATS) --gpus $(GPUS))
	$(MAKE) book

clean:
	rm -rf $(BUILD)
