# One task runner for people and CI. Every target makes the virtual environment first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PROJECTS := pyproject.toml client/pyproject.toml local/pyproject.toml
# Named for the projects' files and for how the venv is made (-bytecode): a change installs again.
STAMP  := $(VENV)/.installed-$(shell cat $(PROJECTS) | cksum | cut -d' ' -f1)-bytecode

# Bytecode caches are written, as scripts/test does: where the environment says not to (many
# containers and CI images set PYTHONDONTWRITEBYTECODE), pytest rewrote every test module's asserts
# in every test process at each run.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: up venv test test-fast lint template docs docs-build format e2e faults localstack bench mutation clean

$(STAMP): $(PROJECTS)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { echo "Error: llmtasks needs Python 3.11 or newer ($(PYTHON) is $$($(PYTHON) --version 2>/dev/null || echo missing)): run make with PYTHON=python3.12 or another 3.11+" >&2; exit 2; }
	@echo "Installing llmtasks (service, client, local tools) and its development tools into $(VENV) ..."
	@# uv writes no bytecode unless told to; where PYTHONDONTWRITEBYTECODE is set, Python never
	@# writes it either, and every process would compile every module it imports again.
	@scripts/install-venv $(VENV) $(PYTHON) llmtasks --compile-bytecode -e . -e ./client -e ./local --group dev
	@touch $@
	@echo "The CLI is $(BIN)/llmtasks (the docs call it so; or: export PATH=\"$$PWD/$(BIN):\$$PATH\")"

## The venv, and the bytecode of the project's own sources (installed editable, so not compiled by
## the install) brought up to date.
venv: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 src local client functions >/dev/null || { echo "Error: a source file of the project does not compile (python -m compileall src local client functions shows which)" >&2; exit 1; }

## The whole local stack: moto, the API on 127.0.0.1:3000, the functions' event sources, the mock LLM.
up: venv
	$(BIN)/llmtasks up --warm-containers eager $(ARGS)

## Every check CI runs, phase by phase with their times (scripts/test): the venvs and the system
## packages; all tests but the load suites (unit, integration, e2e, the docs' blocks) with lint,
## types, the template's checks and the docs site's strict build beside them; then the fault,
## scheduling, LocalStack, crash and CPU-bound suites.
test:
	@scripts/test $(PYTEST_ARGS)

## The fast tests alone (no end-to-end stack). Five processes on two cores: much of their time
## is waiting (call slots, pollers, retries, timeouts), and each takes the next test as it frees.
test-fast: venv
	$(BIN)/pytest -n 5 --dist worksteal -m "not e2e" $(PYTEST_ARGS)

e2e: venv
	$(BIN)/pytest -m e2e $(PYTEST_ARGS)

faults: venv
	$(BIN)/pytest -m faults $(PYTEST_ARGS)

## The integration suite again, with SQS served by a real LocalStack (its own venv, Python 3.13).
localstack: venv
	scripts/localstack-tests $(PYTEST_ARGS)

## The benchmark: overhead, scale, goodput under a rate limit, AWS calls and cost per task, the
## Celery baseline, call slots, scheduling, cold start. Prints figures and ratios and writes
## bench/RESULTS.md (ARGS=--quick for a smaller run).
bench: venv
	@scripts/system-packages
	$(BIN)/python bench/run.py $(ARGS)

## Format, lint and types (ruff, mypy on the package, the handlers and the bench), cfn-lint.
lint: $(STAMP)
	@$(BIN)/ruff format --check . || { echo "Error: ruff format would change the files above: make format rewrites them" >&2; exit 1; }
	@$(BIN)/ruff check . || { echo "Error: ruff check found the problems above (make format fixes some)" >&2; exit 1; }
	@$(BIN)/mypy || { echo "Error: mypy found the type errors above in src/, client/ or local/" >&2; exit 1; }
	@$(BIN)/lint-imports --no-cache || { echo "Error: an import breaks a layer rule above (the contracts: [tool.importlinter] in pyproject.toml)" >&2; exit 1; }
	@for handler in functions/*/app.py; do $(BIN)/mypy $$handler >/dev/null || { $(BIN)/mypy $$handler; echo "Error: mypy found the type errors above in $$handler" >&2; exit 1; }; done
	@$(BIN)/mypy bench/run.py bench/handlers_in_process.py || { echo "Error: mypy found the type errors above in bench/" >&2; exit 1; }
	@$(BIN)/cfn-lint template.yaml || { echo "Error: cfn-lint found the problems above in template.yaml" >&2; exit 1; }

## The template as AWS's tools see it: sam validate --lint, checkov, sam build and its artifact
## (SAM CLI in .venv-sam, checkov in .venv-checkov).
template: $(STAMP)
	PYTHON=$(PYTHON) scripts/check-template

## Mutation testing of the core (not in make test: it takes long): the modules in pyproject's
## [tool.mutmut], the unit suite against each mutant; then the survivors. MUTANTS narrows it,
## e.g. make mutation MUTANTS="llmtasks.services.webhooks*".
mutation: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/mutmut run $(MUTANTS)
	$(BIN)/mutmut results

## The documentation site (mkdocs.yml, docs/) served with live reload on http://127.0.0.1:8000.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve $(ARGS)

## The site built as make test builds it: a broken link, anchor or page fails.
docs-build: $(STAMP)
	@d=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir "$$d"; status=$$?; rm -rf "$$d"; [ $$status -eq 0 ] || { echo "Error: mkdocs build --strict found the problems above in docs/ or mkdocs.yml" >&2; exit 1; }

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .import_linter_cache .mypy_cache .ruff_cache .aws-sam mutants
