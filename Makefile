# make demo: install into .venv (created when missing), then `landscape demo`: FedAvg, FedSAM and FedNSAM on the
#            bundled digits data, analysed, with comparison figures and an HTML report under runs/demo.
# make test: install into .venv and run the test suite, a pytest-xdist worker per core (at most 4; one torch
#            thread each, tests/conftest.py), each test file on one worker.
# Python caches byte-code as it imports (the first import of a module writes its .pyc), so pip need not compile
# every installed file ahead (--no-compile: torch alone has thousands), even where the environment says not to
# write byte-code (PYTHONDONTWRITEBYTECODE: then every process would compile torch from source again).
unexport PYTHONDONTWRITEBYTECODE

VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.landscape-installed

.PHONY: demo test install

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/landscape demo --out runs/demo

test: $(STAMP)
	$(PY) -m pytest -n auto --maxprocesses 4 --dist loadfile
