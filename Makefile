# Two commands work on a fresh machine: `make demo` and `make test`.
# Each creates .venv when missing and installs what its command needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch==2.13.0 resolves to the CPU wheel on these machines; any other spec may pull CUDA.
PIP := $(BIN)/pip install --disable-pip-version-check -q

.PHONY: demo test test-fast setup-core setup-all clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q --upgrade pip

# Stamp files keep a second `make` from reinstalling.
$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(PIP) torch==2.13.0
	$(PIP) -e ".[torch,demo-model]"
	touch $@

$(VENV)/.all: pyproject.toml $(VENV)/.core
	$(PIP) -e ".[torch,jax,service,sweep,demo-model,tasks,harness,dev]"
	touch $@

setup-core: $(VENV)/.core
setup-all: $(VENV)/.all

demo: $(VENV)/.core
	$(BIN)/tunix-rt demo $(ARGS)

# The suite in two passes: the tests not marked `serial` on TEST_WORKERS processes (pytest-xdist,
# one test file per process at a time, one OpenMP thread each: tests/conftest.py), then the
# `serial` ones alone (they time themselves or race a lease: another process's load could fail
# them by chance). Either pass may select nothing (exit 5), not both.
TEST_WORKERS ?= 2
define SUITE
a=0; $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not serial$(1)" $(2) $(PYTEST_ARGS) || a=$$?; \
b=0; $(BIN)/python -m pytest -m "serial$(1)" $(2) $(PYTEST_ARGS) || b=$$?; \
echo "pytest: parallel pass exit $$a, serial pass exit $$b"; \
[ $$a -eq 0 -o $$a -eq 5 ] && [ $$b -eq 0 -o $$b -eq 5 ] && [ "$$a$$b" != 55 ]
endef

test: $(VENV)/.all
	$(call SUITE,,)

test-fast: $(VENV)/.all
	$(call SUITE, and not slow,-x)

clean:
	rm -rf $(VENV) .pytest_cache
