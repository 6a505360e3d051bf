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

.PHONY: install serve test test-rootless lint bench bench-code-mode bench-tool-list clean browser nginx \
	prometheus image image-base containers kubectl FORCE

# The sandbox's template builds one C module of its own at install (jail/_spawn.c): a C
# compiler and the interpreter's headers, from Debian's packages if missing.
HAS_HEADERS := import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))

# The module is built in place, beside its source; the stamp lives in the venv. A clean that
# keeps the venv (`git clean -fdx -e .venv`) removes the module and keeps the stamp, so the
# install is redone whenever the module is missing (tests/test_install.py).
SPAWN ?= src/toolkiln/sandbox/jail/_spawn$(shell $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) \
  -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')

$(STAMP): pyproject.toml src/toolkiln/sandbox/jail/_spawn.c $(if $(wildcard $(SPAWN)),,FORCE)
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

$(BUNDLE): $(WEB_DEPS) $(wildcard $(WEB)/src/*.js) $(wildcard $(WEB)/src/*.css)
	cd $(WEB) && npm run --silent build

install: $(STAMP) $(BUNDLE)

# The browser tests drive Debian's Chromium (browsers cannot be downloaded here).
browser:
	@test -x $(CHROMIUM) || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null; }

# The metrics test runs Debian's Prometheus against a service (its own config, data dir and
# free port: no system service is used).
prometheus:
	@command -v prometheus >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# The replica test puts Debian's nginx in front of two replicas. The package is unpacked into
# the venv, not installed: no system service is set up or started.
NGINX_LOCAL := $(VENV)/nginx/usr/sbin/nginx
nginx:
	@command -v nginx >/dev/null || test -x $(NGINX_LOCAL) || { \
	  apt-get update -qq && cd $(VENV) && apt-get download -qq nginx 2>/dev/null && \
	  dpkg -x nginx_*.deb nginx && rm -f nginx_*.deb; }

# The image (Containerfile; docs/deployment.md): `make image IMAGE=registry.example.org/toolkiln:1`.
# PODMAN may carry global flags, e.g. `PODMAN="podman --runtime runc"` where crun refuses the
# host's cgroups. The host's CA bundle, when there is one, is lent to the build for pip and
# npm (a proxy with its own authority); it is not copied into the image.
IMAGE ?= localhost/toolkiln:latest
PODMAN ?= podman
HOST_CA := /etc/ssl/certs/ca-certificates.crt
IMAGE_CA := $(if $(wildcard $(HOST_CA)),-v $(dir $(HOST_CA)):/run/host-certs:ro \
  --build-arg PIP_CERT=/run/host-certs/$(notdir $(HOST_CA)) \
  --build-arg NODE_EXTRA_CA_CERTS=/run/host-certs/$(notdir $(HOST_CA)))
# Stages one after another: with --jobs, podman 4.3 may remove a stage's base while a sibling
# stage still runs on it ("layer not known"; buildah issue 5805, seen here).
image:
	$(PODMAN) build --tag $(IMAGE) $(IMAGE_CA) .

# The image tests need Debian's podman (with runc: crun refuses a hybrid cgroup layout) and,
# where no image registry is reachable, `image-base`: the base the Containerfile names, made
# under that name from Debian's packages (mmdebstrap, slimmed as the registry's is). A base
# that is there already, pulled or made, is kept.
IMAGE_BASE = $(shell sed -n 's/^ARG BASE=//p' Containerfile)
DEBIAN_MIRROR ?= http://deb.debian.org
containers:
	@missing=; for p in podman runc mmdebstrap uidmap; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  test -z "$$missing" || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; }

image-base: containers
	@$(PODMAN) image exists $(IMAGE_BASE) || { \
	  mmdebstrap --quiet --variant=minbase --dpkgopt=force-unsafe-io \
	    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
	    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
	    --dpkgopt='path-exclude=/usr/share/locale/*' --aptopt='Acquire::Languages "none"' \
	    bookworm - "deb $(DEBIAN_MIRROR)/debian bookworm main" \
	    "deb $(DEBIAN_MIRROR)/debian bookworm-updates main" \
	    "deb $(DEBIAN_MIRROR)/debian-security bookworm-security main" \
	  | $(PODMAN) import --quiet - $(IMAGE_BASE) >/dev/null; }

# The manifests test renders deploy/kubernetes with kustomize, built into Debian's kubectl
# (package kubernetes-client), unpacked into the venv like nginx.
KUBECTL_LOCAL := $(VENV)/kubectl/usr/bin/kubectl
kubectl:
	@test -x $(KUBECTL_LOCAL) || { \
	  apt-get update -qq && cd $(VENV) && apt-get download -qq kubernetes-client 2>/dev/null && \
	  dpkg -x kubernetes-client_*.deb kubectl && rm -f kubernetes-client_*.deb; }

serve: install
	$(BIN)/toolkiln serve

lint: install
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports
	cd $(WEB) && npm run --silent lint

test: lint browser nginx prometheus containers kubectl
	$(BIN)/pytest -q --durations=25
	$(BIN)/python -m tests.runners.rootless_suite subuid -q $(ROOTLESS_QUICK)

# The jail tests with the test process itself as a rootless runner
# (tests/runners/rootless_suite.py): an unprivileged user that makes its own user namespace
# (subuid), and root of a user namespace mapped to an unprivileged range (namespace-root).
# `make test` runs ROOTLESS_QUICK in the first shape; this runs them all, in both.
ROOTLESS_SHAPES ?= subuid namespace-root
ROOTLESS_TESTS ?= tests/security tests/sandbox
ROOTLESS_QUICK = tests/security/test_child_jail.py tests/security/test_python_attacks.py \
  tests/security/test_quotas.py tests/security/test_scratch_privacy.py \
  tests/security/test_slots.py tests/sandbox/test_selftest.py
test-rootless: install containers
	@for shape in $(ROOTLESS_SHAPES); do \
	  $(BIN)/python -m tests.runners.rootless_suite $$shape -q $(ROOTLESS_TESTS) || exit 1; done

bench: install
	$(BIN)/python bench/invoke.py

bench-code-mode: install
	$(BIN)/python bench/code_mode.py

bench-tool-list: install
	$(BIN)/python bench/tool_list.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(WEB)/node_modules $(BUNDLE)
