# Two commands do all set-up on a fresh machine:  make book  and  make test.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BUILD := _build
# studies to re-execute (make reproduce STUDIES="02_gpu_costs 05_attention" PROFILE=full), in an order where each
# notebook finds what it reads: 08 replays 01's runs and 02 compares with 08's; 03 draws 06's measured α
STUDIES ?= 01_scheduling 08_simulator 02_gpu_costs 06_hf_assisted 03_speculative 04_kv_cache 05_attention 07_prefix_cache
PROFILE ?= auto
# independent repeats per study (make reproduce REPEATS=3); empty: one run each
REPEATS ?=


.PHONY: venv lint book test test-lib test-notebooks test-book browser reproduce clean

venv: $(STAMP)
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

# Render the book from the committed, already executed notebooks (execute_notebooks: off).
# --all: a full build every time, so that changed static files and data includes are never stale.
book: $(STAMP)
	$(PY) -m servelab_book prepare --root .
	$(VENV)/bin/jupyter-book build . --all --builder html -W -n --keep-going
	@echo "The book: $(CURDIR)/$(BUILD)/html/index.html"

# ruff: lint and format, configured in pyproject.toml; any finding fails.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint test-lib test-notebooks test-book

test-lib: $(STAMP)
	$(PY) -m pytest -q tests || [ $$? -eq 5 ]

# Every study notebook in the smoke profile (profile="auto" picks it without CUDA), writing to scratch.
test-notebooks: $(STAMP)
	SERVELAB_RESULTS=$$(mktemp -d) $(PY) -m pytest -q --nbval-lax -p no:cacheprovider notebooks || [ $$? -eq 5 ]

# Check the built book, then open every page in headless Chromium (screenshots: tests/_artifacts/).
test-book: book browser
	$(PY) -m servelab_book check $(BUILD)/html
	SERVELAB_BOOK_HTML=$(BUILD)/html $(PY) -m pytest -q -p no:cacheprovider tests/browser

# Debian's chromium and its driver, for the browser test; skipped where they are installed.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then echo "chromium: $$(/usr/bin/chromedriver --version)"; \
	else apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; fi

# Re-execute studies with papermill into book/studies (PROFILE=full on a GPU). 08_simulator (after 01, whose
# measurements it replays) becomes book/simulator.ipynb; 03 and 06 share one trained family ($$SERVELAB_TRAINED).
# REPEATS=3: each study as 3 fresh processes (seeds base+r), verdicts combined (servelab.studies.common.repeat_runs);
# the simulator has no verdicts of its own and runs once. PARAMS="-p name value ..." go to every run.
reproduce: $(STAMP)
	export SERVELAB_TRAINED=$${SERVELAB_TRAINED:-$$(mktemp -d)}; for s in $(STUDIES); do \
	  dest=book/studies/$$s.ipynb; [ $$s = 08_simulator ] && dest=book/simulator.ipynb; \
	  if [ -n "$(REPEATS)" ] && [ $$s != 08_simulator ]; then \
	    $(PY) -m servelab.studies.common.repeat_runs $$s --repeats $(REPEATS) --profile $(PROFILE) $(PARAMS) || exit 1; \
	  else \
	    $(PY) -m papermill --cwd notebooks notebooks/$$s.ipynb $$dest -p profile $(PROFILE) $(PARAMS) || exit 1; \
	  fi; \
	done

clean:
	rm -rf $(BUILD)
