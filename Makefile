# Toolkiln: `make serve` runs the service on its embedded defaults; `make test` runs every check.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

# The view's bundle: npm packages pinned in frontend/package-lock.json, built with esbuild;
# Biome (pinned there too) formats and lints its sources (`npm run format` in frontend/ fixes).
WEB := frontend
WEB_DEPS := $(WEB)/node_modules/.installed
BUNDLE := src/toolkiln/web/static/app.js
CHROMIUM ?= /usr/bin/chromium

.PHONY: install serve test lint bench bench-code-mode clean browser nginx

# The sandbox's template builds one C module of its own at install (jail/_spawn.c): a C
# compiler and the interpreter's headers, from Debian's packages if missing.
HAS_HEADERS := import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))

$(STAMP): pyproject.toml src/toolkiln/sandbox/jail/_spawn.c
	@command -v cc >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null; }
	@$(PYTHON) -c '$(HAS_HEADERS)' || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-dev >/dev/null; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@

$(WEB_DEPS): $(WEB)/package.json $(WEB)/package-lock.json
	@command -v npm >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	cd $(WEB) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(BUNDLE): $(WEB_DEPS) $(wildcard $(WEB)/src/*.js)
	cd $(WEB) && npm run --silent build

install: $(STAMP) $(BUNDLE)

# The browser tests drive Debian's Chromium (browsers cannot be downloaded here).
browser:
	@test -x $(CHROMIUM) || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null; }

# The replica test puts Debian's nginx in front of two replicas. The package is unpacked into
# the venv, not installed: no system service is set up or started.
NGINX_LOCAL := $(VENV)/nginx/usr/sbin/nginx
nginx:
	@command -v nginx >/dev/null || test -x $(NGINX_LOCAL) || { \
	  apt-get update -qq && cd $(VENV) && apt-get download -qq nginx 2>/dev/null && \
	  dpkg -x nginx_*.deb nginx && rm -f nginx_*.deb; }

serve: install
	$(BIN)/toolkiln serve

lint: install
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports
	cd $(WEB) && npm run --silent lint

test: lint browser nginx
	$(BIN)/pytest -q

bench: install
	$(BIN)/python bench/invoke.py

bench-code-mode: install
	$(BIN)/python bench/code_mode.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(WEB)/node_modules $(BUNDLE)
