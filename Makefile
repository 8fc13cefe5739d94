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

test: install-test
	$(BIN)/python -m pytest

install: $(VENV)/.installed $(VENDOR)

install-test: install system-packages $(VENV)/.installed-test

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

# The integration and browser tests start real nginx and drive Debian's Chromium.
system-packages:
	@if ! command -v nginx >/dev/null || ! [ -x /usr/bin/chromium ]; then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q nginx chromium fonts-dejavu-core; \
	fi

clean:
	rm -rf $(VENV) node_modules static/vendor
