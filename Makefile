# portbench: two commands do all the set-up on a fresh machine.
#   make test   create .venv (if needed), install the project and its test tools, run the tests
#   make book   the same set-up, then the whole study end to end: campaign (reused when its results
#               are present), every notebook executed with papermill, the Jupyter Book HTML
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.portbench-installed

.PHONY: test book setup campaign clean-venv browser

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,transformers]"
	@touch $(STAMP)

test: $(STAMP) browser
	$(BIN)/python -m pytest -q

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

clean-venv:
	rm -rf $(VENV)
