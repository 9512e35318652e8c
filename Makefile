# The two commands: `make demo` and `make test`. Everything else is a step they call.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
KBATCH := $(VENV)/bin/kbatch
# pip keeps its cache (~/.cache/pip) so the ~3 GB torch wheel downloads once per machine.
PIP_FLAGS ?= --disable-pip-version-check
# Every dependency, the [serve] extra and the dev tools included, pinned by `uv pip compile`
# (make lock).
LOCK := requirements.lock
LOCK_FLAGS ?=
# promtool (Debian package prometheus) and kcat: the alert-rule and docs tests run them.
DEB_TOOLS := promtool:prometheus kcat:kcat

.PHONY: setup lock tools broker test test-confluent chaos lint typecheck unit integration demo bench docs clean

# Exactly the locked versions, then the project itself without resolving anything again.
$(VENV)/.installed: $(LOCK) pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -q -r $(LOCK)
	$(PY) -m pip install $(PIP_FLAGS) -q --no-deps -e .
	touch $@

setup: $(VENV)/.installed

# Refresh the lock from pyproject.toml, keeping current pins where they still fit.
# Upgrade: make lock LOCK_FLAGS=--upgrade  (one package: LOCK_FLAGS='--upgrade-package torch')
lock: setup
	$(VENV)/bin/uv pip compile -q pyproject.toml --extra serve --extra dev --universal --python-version 3.11 \
		--custom-compile-command "make lock" -o $(LOCK) $(LOCK_FLAGS)

# Installs the Debian tools when missing (root with apt-get); otherwise says what to install.
tools:
	@missing=""; for pair in $(DEB_TOOLS); do \
		command -v "$${pair%%:*}" >/dev/null || missing="$$missing $${pair##*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing$$missing (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends$$missing </dev/null >/dev/null; \
	else \
		echo "make tools: please install$$missing (Debian/Ubuntu: sudo apt-get install$$missing);" \
			"the tests that need them skip" >&2; \
	fi

broker: setup
	$(KBATCH) broker start

PY_DIRS := consumer producer_tools schemas tests

lint: setup
	$(VENV)/bin/ruff check $(PY_DIRS)
	$(VENV)/bin/ruff format --check $(PY_DIRS)

typecheck: setup
	$(VENV)/bin/mypy

# The integration tests of Kafka semantics (exactly-once with fencing and the consumer group
# protocol, commit metadata, static membership, kill -9, bursts and a member leaving) once more
# on confluent-kafka: every kbatch process a test starts inherits KBATCH_KAFKA_CLIENT. The
# adapters' own contract suites (tests/integration/test_confluent_*.py) run both clients in the
# first pass. `make test-confluent` runs every integration test on confluent-kafka (~25 min).
CONFLUENT_TESTS := tests/integration/test_exactly_once.py tests/integration/test_no_replay.py \
	tests/integration/test_static_membership.py tests/integration/test_serve_faults.py
CONFLUENT_FAULTS := two_members or sigkill or burst

test: setup tools broker lint typecheck
	$(VENV)/bin/pytest -q -p no:cacheprovider
	KBATCH_KAFKA_CLIENT=confluent $(VENV)/bin/pytest -q -p no:cacheprovider $(CONFLUENT_TESTS) \
		-k "not test_serve_faults or $(CONFLUENT_FAULTS)"

test-confluent: setup tools broker
	KBATCH_KAFKA_CLIENT=confluent $(VENV)/bin/pytest -q -p no:cacheprovider tests/integration

# The long cluster fault scenarios (docs/CLUSTER.md): a three-node cluster of their own,
# ~10 minutes on two cores.
chaos: setup tools broker
	$(VENV)/bin/pytest -q -p no:cacheprovider -s -m chaos_long tests/chaos

demo: setup broker
	$(KBATCH) demo

bench: setup broker
	$(KBATCH) bench engine

# The documentation site (mkdocs.yml) into site/, strict: a broken link or a page missing from
# the nav fails it (tests/unit/test_docs_site.py runs the same build in make test). The
# generated reference pages are committed; scripts/reference_docs.py --write renews them.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
