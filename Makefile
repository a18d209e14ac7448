# llmnote: build the book, run the tests, open the notebooks.
#   make venv     create .venv and install the exact tested set (constraints.txt)
#   make vendor   install the site's browser scripts (npm) into vendor/site/
#   make book     execute the notebooks and build the website into _build/html
#   make test     lint, unit tests, every notebook (nbval), the book, a headless-browser check
#   make lab      open the notebooks in JupyterLab
#   make gpu-check on a CUDA machine: the GPU tests and every notebook's GPU branches (nbval),
#                 natively and again as a pre-Ampere GPU would run them (LLMNOTE_CAPABILITY=7.5)
#   make strip    remove outputs from the notebooks before committing
#   make clean    remove build outputs (keeps .venv and the execution cache: make distclean)

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# jupyter-book runs notebooks with the kernel "python3": with .venv/bin first on PATH and
# the kernel spec installed into the venv (see venv), that kernel is the venv's python.
export PATH := $(abspath $(BIN)):$(PATH)
# Plotly's notebook renderer writes figures that draw with no kernel; the site's extension
# (_ext/offline_site.py) replaces the plotly.js each output inlines by one vendored copy.
export PLOTLY_RENDERER := notebook

NOTEBOOK_DIRS := $(wildcard chapters labs)
VENV_STAMP := $(VENV)/.installed
# jupyter-cache re-runs a notebook only when its own code changes. When the package or
# the assets it reads change, drop the execution cache and Sphinx's environment so that
# every page is executed again.
PACKAGE_FILES := $(shell find src assets -type f -not -path '*/__pycache__/*' 2>/dev/null)
PACKAGE_STAMP := _build/.package-stamp
VENDOR_STAMP := vendor/site/.installed
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

# The test command, in one place: README and .ci/run call `make test`, which runs these.
LINT_CMD := $(BIN)/ruff check .
BOOK_CMD := $(BIN)/jupyter-book build . --builder html -W -n --keep-going
# Two workers on two cores: one intra-op thread each (with two, torch's OpenMP threads spin
# against the other worker's and the run takes about a third longer).
PYTEST_CMD := OMP_NUM_THREADS=1 $(BIN)/pytest -n 2 --dist loadscope --nbval-lax --nbval-current-env tests $(NOTEBOOK_DIRS)
# The GPU check: the GPU tests (marked gpu), the tests that run on the runtime's device (marked
# device: kernels and lab graders) and every notebook, on a CUDA GPU, once as the
# GPU is and once as a T4 (compute capability 7.5: no bfloat16 in the Triton kernels, no TMA,
# no Gluon), which is what Colab's free GPU runs. GPU_PYTHON: an interpreter whose torch sees
# the GPU; GPU_WORKERS: pytest workers. Notebooks stay whole on one worker (loadscope); the
# tests spread one by one (most GPU tests sit in one module, which loadscope would serialise).
GPU_PYTHON ?= $(BIN)/python
GPU_WORKERS ?= 4
GPU_PYTEST := $(GPU_PYTHON) -m pytest -n $(GPU_WORKERS) -p no:cacheprovider
# Both halves run even when the first fails; the status is the first failure's.
GPU_CHECK_CMD := tests=0; $(GPU_PYTEST) -m "gpu or device" tests || tests=$$?; $(GPU_PYTEST) --dist loadscope --nbval-lax --nbval-current-env $(NOTEBOOK_DIRS); exit $$tests
AS_T4 := LLMNOTE_CAPABILITY=7.5

.PHONY: help venv vendor book test gpu-check gpu-check-native gpu-check-t4 lab strip clean distclean

help:
	@sed -n 's/^#   //p' $(firstword $(MAKEFILE_LIST))

venv: $(VENV_STAMP)

$(VENV_STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -r requirements.txt -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (llmnote)" > /dev/null
	touch $@

vendor: $(VENDOR_STAMP)

# vendor/site/ is served as the site's _static/: require.js (+ its config), the
# ipywidgets embedder with its icon fonts, MathJax 3 with its fonts, and plotly.js (one
# copy for the whole site: the figures' own inlined copy is dropped by _ext/offline_site.py).
# The book draws only cartesian traces, so it ships plotly's cartesian bundle (1.5 MB
# instead of 4.8; the build fails if a figure uses a trace type the bundle lacks).
$(VENDOR_STAMP): vendor/package.json vendor/package-lock.json vendor/widgets-setup.js
	cd vendor && npm ci --no-audit --no-fund --loglevel=error
	rm -rf vendor/site && mkdir -p vendor/site/mathjax vendor/site/html-manager
	cp vendor/node_modules/requirejs/require.js vendor/widgets-setup.js vendor/site/
	cp vendor/node_modules/plotly.js-cartesian-dist-min/plotly-cartesian.min.js vendor/site/plotly.min.js
	cp vendor/node_modules/@jupyter-widgets/html-manager/dist/embed-amd.js \
	   vendor/node_modules/@jupyter-widgets/html-manager/dist/*.{woff,woff2,ttf,eot,svg} vendor/site/html-manager/
	cp -r vendor/node_modules/mathjax/es5/{tex-chtml.js,input,output,ui,a11y,adaptors,sre} vendor/site/mathjax/
	touch $@

$(PACKAGE_STAMP): $(PACKAGE_FILES) constraints.txt
	rm -rf _build/.jupyter_cache _build/.doctrees _build/jupyter_execute
	mkdir -p _build && touch $@

# The notebooks run first into the execution cache, as many at once as there are cores
# (scripts/execute_notebooks.py); the build then reads every page's outputs from the cache.
book: venv vendor $(PACKAGE_STAMP)
	$(BIN)/python scripts/execute_notebooks.py
	$(BOOK_CMD)

test: venv vendor
	$(LINT_CMD)
	$(MAKE) --no-print-directory book
	test -x $(CHROMIUM) || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }
	$(PYTEST_CMD)

gpu-check: venv
	$(MAKE) --no-print-directory gpu-check-native gpu-check-t4

# The two halves, without the install step (to run them with another interpreter, e.g.
# `make gpu-check-native GPU_PYTHON=python3`).
gpu-check-native:
	$(GPU_PYTHON) -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu-check needs a CUDA GPU that torch can see")'
	$(GPU_CHECK_CMD)

gpu-check-t4:
	export $(AS_T4); $(GPU_PYTHON) -c 'import llmnote; print(llmnote.runtime.describe())'; $(GPU_CHECK_CMD)

# JupyterLab refuses to start as root unless told to (containers often run as root).
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: venv
	$(BIN)/jupyter lab $(ALLOW_ROOT)

strip: venv
	$(BIN)/python scripts/strip_outputs.py

clean:
	rm -rf _build/html tests/screenshots vendor/site

distclean: clean
	rm -rf _build vendor/node_modules $(VENV)
