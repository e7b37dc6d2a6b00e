# Two commands on a fresh machine: `make demo` and `make test`. Each makes .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test

.PHONY: demo test lint typecheck unit conformance bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/nnrp-gateway demo

test: lint typecheck unit conformance

lint: $(STAMP)
	$(BIN)/ruff check gateway cli tests

typecheck: $(STAMP)
	$(BIN)/mypy --strict gateway cli

unit: $(STAMP)
	$(BIN)/pytest -q

conformance: $(STAMP)
	BIN=$(BIN) bash .ci/conformance

bench: $(STAMP)
	$(BIN)/nnrp-gateway bench codec
	$(BIN)/nnrp-gateway bench wire

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
