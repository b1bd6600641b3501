# One venv in the repo root; every target uses it.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-all test-gpu coverage lint train clean

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,export,data,search,sweep]'
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
	$(VENV)/bin/ruff check vit hydra_plugins scripts lab tests train.py
	$(VENV)/bin/ruff format --check vit hydra_plugins scripts lab tests train.py

# The first command a newcomer types finishes in a time they would wait for on the machine they have: on a GPU,
# ViT-Tiny on CIFAR-10 for 100 epochs; without one (where that would take more than half a day), the 30-minute CPU
# recipe, on CIFAR-10 as torchvision downloads it (docs/RESULTS.md measured it on the JPEG copy), said in its first line.
train: $(STAMP)
	@if $(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		echo "make train: ViT-Tiny on CIFAR-10, 100 epochs on the GPU (train.py model=vit_tiny)"; \
		$(PY) train.py model=vit_tiny; \
	else \
		echo "make train: no GPU here, so the 30-minute CPU recipe (train.py experiment=cifar10_cpu data=cifar10:" \
			"trainer.budget=30m plans its steps to end in 30 minutes; model=vit_tiny would take more than half a day)"; \
		$(PY) train.py experiment=cifar10_cpu data=cifar10; \
	fi

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
