# perfzoo: the two commands of the README.
#   make run   create .venv from the lock (once) and run the workflow on the default config
#   make test  create .venv (once), check the rule files' format and the import layers, run the tests
# The lock (requirements.lock, hashes for Linux x86-64/aarch64 and macOS arm64) is installed with
# pip's hash checking; `make lock` regenerates it with uv, keeping the versions already locked.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
UV     ?= uv

.PHONY: run test env report lock clean

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --no-deps -e .
	touch $(STAMP)

env: $(STAMP)

run: $(STAMP)
	$(BIN)/snakemake --cores all

report: $(STAMP)
	$(BIN)/snakemake --report results/report.html

test: $(STAMP)
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

lock:
	$(UV) pip compile pyproject.toml --extra test --universal --generate-hashes --python-version 3.11 \
		-o requirements.lock

clean:
	rm -rf results logs benchmarks
