# perfzoo: the two commands of the README.
#   make run   create .venv from pinned versions (once) and run the workflow on the default config
#   make test  create .venv (once) and run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test env report clean

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

env: $(STAMP)

run: $(STAMP)
	$(BIN)/snakemake --cores all

report: $(STAMP)
	$(BIN)/snakemake --report results/report.html

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf results logs benchmarks
