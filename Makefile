# Glassbox's two set-up commands (see README.md):
#   make run    install what the app needs and start it on the bundled models
#   make test   install what the tests need (Debian packages too) and run every test
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
VENDOR := static/vendor/htmx.min.js static/vendor/sse.js

.PHONY: run test install install-test system-packages clean

run: install
	$(BIN)/gunicorn -c gunicorn.conf.py wsgi:app

# GLASSBOX_REQUIRE_SYSTEM_TESTS: a missing nginx or chromium fails the integration and browser
# tests here instead of skipping them (a bare `pytest` on a developer's machine skips them).
test: install-test
	GLASSBOX_REQUIRE_SYSTEM_TESTS=1 $(BIN)/python -m pytest

install: $(VENV)/.installed $(VENDOR)

# Debian packages first: on a fresh machine npm (for htmx) and python3-venv may be missing too.
install-test: system-packages install $(VENV)/.installed-test

# torch first, pinned, so nothing can pull a CUDA build in its place
$(VENV)/.installed: pyproject.toml
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
	npm ci --no-audit --no-fund --silent
	mkdir -p static/vendor
	cp node_modules/htmx.org/dist/htmx.min.js node_modules/htmx-ext-sse/dist/sse.js static/vendor/

# The integration and browser tests start real nginx and drive Debian's Chromium (never a
# browser downloaded by Playwright). Only what is missing is installed.
APT_NEEDS = $(strip \
	$(shell [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || echo nginx) \
	$(shell [ -x /usr/bin/chromium ] || echo chromium fonts-dejavu-core) \
	$(shell command -v npm >/dev/null || echo npm) \
	$(shell $(PYTHON) -c 'import ensurepip' 2>/dev/null || echo python3-venv))

system-packages:
	@if [ -n "$(APT_NEEDS)" ]; then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $(APT_NEEDS); \
	fi

clean:
	rm -rf $(VENV) node_modules static/vendor
