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

test: $(VENV)/.all
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(VENV)/.all
	$(BIN)/python -m pytest -m "not slow" -x $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
