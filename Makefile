# One venv in the repo root; every target uses it.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-all test-gpu coverage lint train clean

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,export,data,search]'
	touch $(STAMP)

# On every core (pytest-xdist), a test file to a worker, handed out in the order tests/conftest.py gives (the longest
# folders first) rather than by test count; each test stays independent of the others' order.
XDIST := -n auto --dist loadfile --no-loadscope-reorder

# -rs: the summary names every skipped test with its reason (on a machine without a GPU: the cuda tier, and only it).
test: $(STAMP)
	$(PY) -m pytest -q -rs $(XDIST) --durations=30

test-all: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m ''

# Line coverage of vit/ by the default suite (coverage.py, through pytest-cov).
coverage: $(STAMP)
	$(PY) -m pytest -q $(XDIST) --cov=vit --cov-report=term

# The GPU tier alone (tests/e2e/test_cuda.py): skipped, with the reason, where no CUDA device is.
test-gpu: $(STAMP)
	$(PY) -m pytest -q -rs -m cuda tests/e2e/test_cuda.py

lint: $(STAMP)
	$(VENV)/bin/ruff check vit hydra_plugins scripts benchmarks tests train.py
	$(VENV)/bin/ruff format --check vit hydra_plugins scripts benchmarks tests train.py

train: $(STAMP)
	$(PY) train.py model=vit_tiny

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
