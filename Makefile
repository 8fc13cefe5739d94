# Glassbox's two set-up commands (see README.md):
#   make run    install what the app needs and start it on the bundled models
#   make test   install what the tests need (Debian packages too) and run every test
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
VENDOR := static/vendor/htmx.min.js static/vendor/sse.js

.PHONY: run test lint install install-test system-packages-test clean

run: install
	$(BIN)/gunicorn -c gunicorn.conf.py wsgi:app

# GLASSBOX_REQUIRE_SYSTEM_TESTS: a missing nginx or chromium fails the integration and browser
# tests here instead of skipping them (a bare `pytest` on a developer's machine skips them).
# Then the behaviour tests again, each app keeping its history in PostgreSQL instead of SQLite (a fresh
# database of a throwaway cluster each: tests/support/databases.py).
# (each experiment's pages are tested beside its package: tests/chat/<name>/test_*pages.py)
BEHAVIOUR_TESTS = tests/chat/web $(wildcard tests/chat/*/test_*pages.py) tests/chat/features/test_labels.py \
	tests/loops/web tests/web tests/v1 \
	tests/security tests/test_prefs.py tests/chat/test_service.py
test: install-test lint
	GLASSBOX_REQUIRE_SYSTEM_TESTS=1 $(BIN)/python -m pytest
	GLASSBOX_REQUIRE_SYSTEM_TESTS=1 GLASSBOX_TEST_DATABASE=postgres $(BIN)/python -m pytest -q $(BEHAVIOUR_TESTS)

# ruff and mypy, configured in pyproject.toml; `make test` runs them before the tests
lint: install-test
	$(BIN)/ruff check webapp tests bench scripts examples
	$(BIN)/mypy

install: $(VENV)/.installed $(VENDOR)

install-test: system-packages-test install $(VENV)/.installed-test

# torch first, pinned, so nothing can pull a CUDA build in its place
$(VENV)/.installed: pyproject.toml
	@$(call apt-get,$(NEED_VENV))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# htmx comes from the npm registry, pinned in package-lock.json; it is never committed.
$(VENDOR): package.json package-lock.json
	@$(call apt-get,$(NEED_NPM))
	npm ci --no-audit --no-fund --silent
	mkdir -p static/vendor
	cp node_modules/htmx.org/dist/htmx.min.js node_modules/htmx-ext-sse/dist/sse.js static/vendor/

# Debian packages, only what is missing, and only when a target that needs them is (re)built: the
# venv needs python3-venv (and gcc, which compiles the decode kernel for this CPU on first use:
# webapp/chat/model/kernels), htmx needs npm; the integration and browser tests start real nginx and drive
# Debian's Chromium (never a browser downloaded by Playwright); the store tests start a throwaway
# PostgreSQL cluster of their own with Debian's server binaries (tests/support/postgres.py).
NEED_VENV = $(strip $(shell $(PYTHON) -c 'import ensurepip' 2>/dev/null || echo python3-venv) \
	$(shell command -v cc >/dev/null || command -v gcc >/dev/null || echo gcc))
NEED_NPM  = $(shell command -v npm >/dev/null || echo npm)
NEED_TEST = $(strip $(NEED_VENV) $(NEED_NPM) \
	$(shell [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || echo nginx) \
	$(shell [ -x /usr/bin/chromium ] || echo chromium fonts-dejavu-core) \
	$(shell ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || echo postgresql))

# $(call apt-get,PACKAGES): install them (as root, or with sudo); nothing when the list is empty
apt-get = if [ -n "$(strip $(1))" ]; then $(SUDO) apt-get update -q && \
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $(1); fi

system-packages-test:
	@$(call apt-get,$(NEED_TEST))

# one apt-get at a time (dpkg's lock), and packages before what needs them
.NOTPARALLEL:

clean:
	rm -rf $(VENV) node_modules static/vendor
