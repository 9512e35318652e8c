# The two commands: `make demo` and `make test`. Everything else is a step they call.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
KBATCH := $(VENV)/bin/kbatch
# pip keeps its cache (~/.cache/pip) so the ~3 GB torch wheel downloads once per machine.
PIP_FLAGS ?= --disable-pip-version-check

.PHONY: setup broker test lint typecheck unit integration demo bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -q --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

broker: setup
	$(KBATCH) broker start

PY_DIRS := consumer producer_tools schemas tests

lint: setup
	$(VENV)/bin/ruff check $(PY_DIRS)
	$(VENV)/bin/ruff format --check $(PY_DIRS)

typecheck: setup
	$(VENV)/bin/mypy

test: setup broker lint typecheck
	$(VENV)/bin/pytest -q -p no:cacheprovider

demo: setup broker
	$(KBATCH) demo

bench: setup broker
	$(KBATCH) bench engine

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
