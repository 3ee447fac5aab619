# One task runner for people and CI. Every target makes the virtual environment first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: up test test-fast lint format e2e faults localstack bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "llmtasks needs Python 3.11+ (set PYTHON=...)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

## The whole local stack: moto, the API on 127.0.0.1:3000, the functions' event sources, the mock LLM.
up: $(STAMP)
	$(BIN)/llmtasks up $(ARGS)

## Every check CI runs: format, lint, types, the template (cfn-lint, sam validate --lint, sam build),
## then all tests (unit, integration, e2e), then the integration suite with SQS on LocalStack.
test: lint
	$(BIN)/pytest $(PYTEST_ARGS)
	scripts/localstack-tests $(PYTEST_ARGS)

## The fast tests alone (no end-to-end stack), in seconds.
test-fast: $(STAMP)
	$(BIN)/pytest -m "not e2e" $(PYTEST_ARGS)

e2e: $(STAMP)
	$(BIN)/pytest -m e2e $(PYTEST_ARGS)

faults: $(STAMP)
	$(BIN)/pytest -m faults $(PYTEST_ARGS)

## The integration suite again, with SQS served by a real LocalStack (its own venv, Python 3.13).
localstack: $(STAMP)
	scripts/localstack-tests $(PYTEST_ARGS)

## The benchmark: overhead, scale, long calls, goodput under a rate limit, AWS calls and cost per
## task, cold start. Prints figures and ratios and writes bench/RESULTS.md (about 8 minutes).
bench: $(STAMP)
	$(BIN)/python bench/run.py $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	for handler in functions/*/app.py; do $(BIN)/mypy $$handler || exit 1; done
	$(BIN)/mypy bench/run.py
	$(BIN)/cfn-lint template.yaml
	PYTHON=$(PYTHON) scripts/check-template

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .aws-sam
