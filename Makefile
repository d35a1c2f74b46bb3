# Two entry points (see README): `make demo` runs the main job on the bundled fixtures,
# `make test` runs the test suite. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
EAGLECTL := $(PY) -m eaglectl

.PHONY: demo test docs fixtures bench

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU build of torch 2.13.0 (a local wheel on our machines); installed first so nothing pulls a CUDA build
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	@$(EAGLECTL) formats
	@for d in fixtures/drafters/*/; do \
		echo; echo "=================================================================== $$d"; \
		$(EAGLECTL) inspect "$$d" --allow-pickle --target fixtures/target-llama; \
		echo "exit code: $$?"; \
	done

test: $(STAMP)
	$(PY) -m pytest -n 2

docs: $(STAMP)
	$(PY) docs/generate.py --update

fixtures: $(STAMP)
	$(PY) fixtures/make_fixtures.py

bench: $(STAMP)
	$(PY) benchmarks/bench_inspect.py
