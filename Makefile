# gguflm: `make run` and `make test` work on a fresh machine with only Python 3.11+ and make.
# The virtual environment is made once; a stamp file (rebuilt when pyproject.toml changes)
# makes later runs skip the install.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?= smollm2-135m
PROMPT ?= Once upon a time, in a small village,
N ?= 64
TEST_MODELS := smollm2-135m gemma3-270m all-minilm-l6-v2
PYTEST_ARGS ?=
LINT_PATHS := src tests $(wildcard benchmarks)

.PHONY: help run test lint pull venv dev clean

help:
	@echo "make run    set up .venv, pull the default model, and generate text with it"
	@echo "make test   set up .venv with test tools, pull the test models, run ruff and pytest"
	@echo "make lint   ruff only;  make clean   remove .venv and caches (not the models)"

# --- environments ----------------------------------------------------------------------

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "error: gguflm needs Python 3.11 or newer ($(PYTHON) is older)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.stamp-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	@touch $@

$(VENV)/.stamp-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@ $(VENV)/.stamp-run

venv: $(VENV)/.stamp-run
dev: $(VENV)/.stamp-test

# --- the two commands in the README ----------------------------------------------------

# MODEL may be a path or a known name (pulled on first use); a first run generates while
# the compiled layers compile in the background, whatever stderr is (docs/cli.md#first-run)
run: $(VENV)/.stamp-run
	GGUFLM_BACKGROUND_COMPILE=1 $(BIN)/gguflm run $(MODEL) -p "$(PROMPT)" -n $(N)

test: $(VENV)/.stamp-test
	$(BIN)/gguflm pull $(TEST_MODELS)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# --- helpers ---------------------------------------------------------------------------

pull: $(VENV)/.stamp-run
	$(BIN)/gguflm pull $(TEST_MODELS)

lint: $(VENV)/.stamp-test
	$(BIN)/ruff check $(LINT_PATHS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build src/*.egg-info
