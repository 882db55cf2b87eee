# searchrl: the documented interface. Recipes call `searchrl ...` or a tool; logic lives in Python.
# Knobs: make serve-retrieval BACKEND=bm25 PORT=8001 ; make test ARGS="-k app -x"

PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# CPU wheel on this class of machine; on a GPU box use e.g. TORCH_SPEC="torch==2.13.0" with the CUDA index.
TORCH_SPEC ?= torch==2.13.0
BACKEND ?= dense
HOST    ?= 127.0.0.1
PORT    ?= 8000
ARGS    ?=
ENV     ?=

.PHONY: help serve-retrieval test test-unit check fmt install install-dev clean-index

help:  ## list targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# --- environments ---------------------------------------------------------------------------------------------
# torch goes in first, alone: a resolver asked for torch by another package would pull a multi-GB CUDA build.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	@touch $@

$(VENV)/.retrieval: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install -q -e '.[retrieval]'
	@touch $@

$(VENV)/.dev: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install -q -e '.[retrieval,train,infer,dev]'
	@touch $@

install: $(VENV)/.retrieval  ## install the retrieval service into .venv
install-dev: $(VENV)/.dev  ## install everything the tests need into .venv

# --- run ------------------------------------------------------------------------------------------------------
serve-retrieval: $(VENV)/.retrieval  ## serve the bundled Wikipedia subset on HOST:PORT (BACKEND=dense|bm25)
	$(BIN)/searchrl serve --backend $(BACKEND) --host $(HOST) --port $(PORT)

# --- quality --------------------------------------------------------------------------------------------------
test: $(VENV)/.dev  ## run the whole test suite (what README and CI run)
	$(BIN)/python -m pytest $(ARGS)

test-unit: $(VENV)/.dev  ## tests that start no server
	$(BIN)/python -m pytest -m "not live and not slow" $(ARGS)

check: $(VENV)/.dev  ## lint and format check (never edits)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

fmt: $(VENV)/.dev  ## format and fix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-index:  ## delete built corpora and indexes under data/
	rm -rf data/corpora data/indexes
