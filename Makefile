# Glassbox's two set-up commands (see README.md):
#   make run    install what the app needs and start it on the bundled models
#   make test   install what the tests need (Debian packages too) and run every test
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
VENDOR := static/vendor/htmx.min.js static/vendor/sse.js

.PHONY: run test install install-test system-packages system-packages-test apt-get clean

run: install
	$(BIN)/gunicorn -c gunicorn.conf.py wsgi:app

# GLASSBOX_REQUIRE_SYSTEM_TESTS: a missing nginx or chromium fails the integration and browser
# tests here instead of skipping them (a bare `pytest` on a developer's machine skips them).
test: install-test
	GLASSBOX_REQUIRE_SYSTEM_TESTS=1 $(BIN)/python -m pytest

# Debian packages first: on a fresh machine npm (for htmx) and python3-venv may be missing.
install: system-packages $(VENV)/.installed $(VENDOR)

install-test: system-packages-test install $(VENV)/.installed-test

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

# Only what is missing is installed. The app needs npm (for htmx) and python3-venv; the
# integration and browser tests also start real nginx and drive Debian's Chromium (never a
# browser downloaded by Playwright).
APT_RUN = $(strip \
	$(shell command -v npm >/dev/null || echo npm) \
	$(shell $(PYTHON) -c 'import ensurepip' 2>/dev/null || echo python3-venv))
APT_TEST = $(strip $(APT_RUN) \
	$(shell [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || echo nginx) \
	$(shell [ -x /usr/bin/chromium ] || echo chromium fonts-dejavu-core))

system-packages:
	@$(MAKE) --no-print-directory apt-get PACKAGES="$(APT_RUN)"

system-packages-test:
	@$(MAKE) --no-print-directory apt-get PACKAGES="$(APT_TEST)"

apt-get:
	@if [ -n "$(PACKAGES)" ]; then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $(PACKAGES); \
	fi

clean:
	rm -rf $(VENV) node_modules static/vendor
