# The two commands the README promises: `make demo` and `make test`.
# Everything else here is a building block of those two.
VENV ?= .venv
PY := $(VENV)/bin/python
MIN_PY ?= 3.12
DJANGO_SPEC ?=
PYTEST_ARGS ?=
# e.g. CHAOS_ARGS="--tasks 200 --seed 3" (default: every scenario, 500 tasks each)
CHAOS_ARGS ?=

export VENV MIN_PY DJANGO_SPEC

.PHONY: setup test lint unit integration tooling chaos browser cluster demo bench tox clean

setup:
	@./scripts/bootstrap.sh

# ruff, the import layers (setup.cfg), mypy, and the docs site (mkdocs.yml): --strict
# fails on a broken link or anchor and on a page missing from the nav; built into a temp
# dir, removed after. (Not --quiet: with it MkDocs does not count the warnings that
# --strict turns into a failure.)
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && \
		NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$site"

# The whole suite: unit, integration and chaos markers, after lint.
test: setup lint
	$(PY) -m pytest $(PYTEST_ARGS)

unit: setup
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

integration: setup
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

# The tests of the test tooling (tests/tooling/): the private servers, the workers and
# the lost-reply proxy the other tiers stand on. `make test` runs them too.
tooling: setup
	$(PY) -m pytest -m tooling $(PYTEST_ARGS)

# The chaos tier (each runner scenario small, among the rest; the fenced inbox's kills
# and zombies over 500 tasks; every cell of the composition matrix, where CI runs a
# sample), then every scenario full-size.
chaos: setup
	CHAOS_INBOX_TASKS=500 CHAOS_COMPOSITION_SAMPLE=all $(PY) -m pytest -m chaos $(PYTEST_ARGS)
	$(PY) -m chaos run all $(CHAOS_ARGS)

browser: setup
	$(PY) -m pytest -m browser $(PYTEST_ARGS)

cluster: setup
	$(PY) -m pytest -m cluster $(PYTEST_ARGS)

demo: setup
	$(PY) scripts/demo.py

bench: setup
	$(PY) -m pip install -q -e ".[test,bench]"
	$(PY) -m bench

# The full supported matrix (tox.ini); CI runs `make test` plus the Django 5.2 / Python 3.11 env.
tox: setup
	$(VENV)/bin/python -m pip install -q "tox>=4"
	$(VENV)/bin/tox

clean:
	rm -rf .run .tox .pytest_cache .ruff_cache *.egg-info test-artifacts
