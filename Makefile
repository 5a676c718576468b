# Two commands: `make lab` (the main job) and `make test`. A fresh machine needs nothing else.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.nbdebug-installed

.PHONY: lab test test-main test-fast test-np2 setup lint bench clean browser labextension frontend

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when the packaging, the pins or the native statistics kernel change. --no-compile: pip would
# byte-compile every file of torch, MindSpore and transformers (half the install's time: 2.5 instead of 5 min
# here); Python compiles the modules a process imports, once, on first import — if it may write them: a
# PYTHONDONTWRITEBYTECODE set in the environment (this machine's images set it) would have every process
# compile torch again (the main suite took 26 instead of 15 minutes), so the commands make runs do not get it.
unexport PYTHONDONTWRITEBYTECODE
PIP_INSTALL := install -q --no-compile
$(STAMP): $(PY) pyproject.toml constraints.txt setup.py $(wildcard nbdebug/frameworks/*.c)
	$(PIP) $(PIP_INSTALL) -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# A second, small environment: what a PyTorch user gets with numpy 2 (`pip install nbdebug[torch]` and
# numpy>=2, no MindSpore). torch is pinned here too: that pin resolves to the local CPU wheel.
VENV_NP2 := .venv-np2
PY_NP2 := $(VENV_NP2)/bin/python
STAMP_NP2 := $(VENV_NP2)/.nbdebug-installed

$(PY_NP2):
	$(PYTHON) -m venv $(VENV_NP2)

# Its wheels install while the main environment installs (`make test` makes both on two jobs); the editable
# install of this checkout waits for the main one's (both write nbdebug.egg-info and build the native kernel here)
# and for the lab extension's build (setup.py lists its files).
NP2_DEPS := $(VENV_NP2)/.deps-installed

$(NP2_DEPS): $(PY_NP2)
	$(PY_NP2) -m pip $(PIP_INSTALL) 'torch==2.13.0' 'numpy>=2' 'pandas<3' pytest pytest-timeout pytest-xdist
	touch $@

$(STAMP_NP2): $(NP2_DEPS) pyproject.toml setup.py $(wildcard nbdebug/frameworks/*.c) | $(STAMP) labextension
	$(PY_NP2) -m pip $(PIP_INSTALL) -e '.[torch]'
	touch $(STAMP_NP2)

LABEXT_SRC := labextension/package.json labextension/tsconfig.json \
              $(wildcard labextension/src/*.ts labextension/schema/*.json labextension/style/*)
LABEXT := nbdebug/labextension/package.json
LABEXT_LINK := $(VENV)/share/jupyter/labextensions/nbdebug

labextension/node_modules/.package-lock.json: labextension/package-lock.json labextension/package.json
	cd labextension && npm ci --no-audit --no-fund

# The JupyterLab extension, rebuilt only when its sources change.
$(LABEXT): $(LABEXT_SRC) labextension/node_modules/.package-lock.json | $(STAMP)
	cd labextension && PATH="$(abspath $(VENV))/bin:$$PATH" npm run build
	touch $@

# Editable installs skip data_files: link the build into the dev venv so `make lab` loads it.
$(LABEXT_LINK): | $(STAMP)
	mkdir -p $(dir $@)
	rm -rf $@
	ln -s $(abspath nbdebug/labextension) $@

# nbdebug's own front end (graph, heatmap, relationship diagram): one ES module built by esbuild, shipped
# in the package (ui/static, for export_html) and in the labextension's static files (loaded once per page).
FRONTEND_SRC := frontend/package.json frontend/build.mjs $(wildcard frontend/src/*.ts)
FRONTEND := nbdebug/ui/static/nbdebug-ui.js
FRONTEND_LAB := nbdebug/labextension/static/nbdebug-ui.js

frontend/node_modules/.package-lock.json: frontend/package-lock.json frontend/package.json
	cd frontend && npm ci --no-audit --no-fund

$(FRONTEND): $(FRONTEND_SRC) frontend/node_modules/.package-lock.json
	cd frontend && npm run build

$(FRONTEND_LAB): $(FRONTEND) $(LABEXT)
	cp $(FRONTEND) $@

# plotly.js (the run timeline's charts) is not bundled: its npm dist file sits beside the bundle, loaded once
# per page on the first timeline drawn (frontend/src/timeline.ts); export_html inlines it.
PLOTLY_DIST := frontend/node_modules/plotly.js-cartesian-dist-min/plotly-cartesian.min.js
PLOTLY := nbdebug/ui/static/plotly-cartesian.min.js
PLOTLY_LAB := nbdebug/labextension/static/plotly-cartesian.min.js

$(PLOTLY): frontend/node_modules/.package-lock.json
	mkdir -p $(dir $@)
	cp $(PLOTLY_DIST) $@

$(PLOTLY_LAB): $(PLOTLY) $(LABEXT)
	cp $(PLOTLY) $@

labextension: $(LABEXT) $(LABEXT_LINK) $(FRONTEND_LAB) $(PLOTLY_LAB)

frontend: $(FRONTEND) $(PLOTLY)

setup: $(STAMP) labextension

# `make lab LAB_PORT=8890 LAB_TOKEN=secret LAB_ARGS="--ip=0.0.0.0"`: the port (default: the first free one
# from 8888), the token (default: a new random one) and more JupyterLab options. As root (containers, CI)
# it passes --allow-root; with no display ($$DISPLAY and $$WAYLAND_DISPLAY unset) or under CI, --no-browser.
# It prints the URL to open, with its token. Nothing is installed when .venv is up to date.
LAB_PORT ?= $(shell $(PYTHON) -c 'import socket as s;f=lambda p:s.socket().connect_ex(("127.0.0.1",p))!=0;print(next(p for p in range(8888,8988) if f(p)))')
LAB_TOKEN ?=
LAB_ARGS ?=

lab: setup
	@token="$(LAB_TOKEN)"; [ -n "$$token" ] || token=$$($(PY) -c 'import secrets; print(secrets.token_hex(24))'); \
	opts="--port=$(LAB_PORT) --ServerApp.port_retries=0 --IdentityProvider.token=$$token"; \
	if [ "$$(id -u)" = 0 ]; then opts="$$opts --allow-root"; fi; \
	if { [ -z "$$DISPLAY" ] && [ -z "$$WAYLAND_DISPLAY" ]; } || [ -n "$$CI" ]; then opts="$$opts --no-browser"; fi; \
	echo "jupyter lab notebooks/quickstart.ipynb $${opts/$$token/<token>} $(LAB_ARGS)"; \
	echo "nbdebug: open http://localhost:$(LAB_PORT)/lab/tree/quickstart.ipynb?token=$$token"; \
	exec $(VENV)/bin/jupyter lab notebooks/quickstart.ipynb $$opts $(LAB_ARGS)

# Debian's Chromium for the browser tests (playwright drives it; never `playwright install`).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian chromium for the browser tests"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; }

lint: setup
	$(VENV)/bin/ruff check nbdebug tests bench

# The suite runs on TEST_WORKERS pytest-xdist processes (most tests wait on kernels, torchrun, JupyterLab or
# Chromium): one work unit per module, the modules on the shared JupyterLab/Notebook servers in one unit, the
# longest units first (tests/conftest.py). TEST_WORKERS=0 runs it in this process. Each run lists its slowest
# tests.
TEST_WORKERS ?= 3
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
DURATIONS := --durations=30
# One OpenMP thread per process (torch, MindSpore, and what they start: kernels, torchrun ranks, msProbe runs):
# on a loaded machine several workers, each with a thread per core, spin-wait against each other (two test
# modules took 65 s of CPU with the default, 23 s with one thread, at a load of ~8); on a quiet one the
# suite's CPU is about the same either way (the models are too small for torch to split an op).
# `OMP_NUM_THREADS=… make test` overrides it.
TEST_THREADS := OMP_NUM_THREADS=$(or $(OMP_NUM_THREADS),1)

# The numpy-2 run comes after the main one, not beside it: tried beside it (niced) on two cores, the processes
# its remote tests start were starved past their 60 s connect timeouts.
test:
	$(MAKE) -j2 --output-sync=target setup $(STAMP_NP2)
	$(MAKE) browser lint
	$(MAKE) test-main
	$(MAKE) test-np2

test-main: setup
	$(TEST_THREADS) $(PY) -m pytest -q $(XDIST) $(DURATIONS) --doctest-modules nbdebug tests

# The inner loop: no browser, no process started, no slow module (markers: tests/conftest.py); no lint, no
# numpy-2 run, on 2 workers (1,789 tests in 2 min 35 s on this idle 2-core machine).
# `make test` runs everything.
FAST := not browser and not subprocess and not slow

test-fast: setup
	$(TEST_THREADS) $(PY) -m pytest -q -n 2 --dist loadfile -m "$(FAST)" --doctest-modules nbdebug tests

# The PyTorch tests and the doctests on numpy 2 (tests/torch_only.py leaves out, and names, the modules that
# need MindSpore, msProbe, JupyterLab or the browser).
test-np2: $(STAMP_NP2) labextension
	$(TEST_THREADS) PYTHONPATH=tests $(PY_NP2) -m pytest -q $(XDIST) $(DURATIONS) -p torch_only --doctest-modules nbdebug tests

bench: setup
	$(PY) bench/overhead.py
	$(PY) bench/watch.py
	$(PY) bench/ui.py
	$(PY) bench/compare.py

clean:
	rm -rf $(VENV) $(VENV_NP2) build *.egg-info nbdebug/labextension labextension/lib labextension/node_modules \
		frontend/node_modules nbdebug/ui/static
