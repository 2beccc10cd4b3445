# `make demo` and `make test` each create .venv if it is missing and install tfplaceto into it.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint protos build-file bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel

$(STAMP): $(PY) setup.py
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tfplaceto place builtin:inception_v3 --cluster 4xV100 --out demo_out/placed.pb --report demo_out/report.json --gantt demo_out/gantt.png --overwrite

test: $(STAMP)
	$(PY) -m ruff check tfplaceto tests benchmarks tools
	$(PY) -m pytest -q -m "not slow"

test-all: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check tfplaceto tests benchmarks tools

protos: $(STAMP)
	$(PY) tools/gen_protos.py

build-file: $(STAMP)
	$(PY) tools/gen_build.py

clean:
	rm -rf $(VENV) demo_out
