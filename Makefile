# Two commands on a fresh machine: `make demo` and `make test`.
# torch is pinned here (and only here) so that pip never picks another multi-GB build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
# `make test` runs the tests in parallel (pytest-xdist), one worker per core and one more, up to 4: many tests
# wait on processes they start (start-up, torchrun's rendezvous, a kill and its resume), and a worker that waits
# leaves its core to another; each worker and the bertforge processes it starts share its part of the cores
# (BERTFORGE_THREADS, tests/conftest.py). TEST_WORKERS=0 runs them in one process. The slow tests come first
# (tests/conftest.py) and a worker that runs out takes half of another's queue (--dist worksteal), so that no
# worker is left alone with a queue of long tests at the end.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); n=$$((n + 1)); [ "$$n" -gt 4 ] && n=4; echo $$n)

.PHONY: demo test install clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile $(TORCH_PIN)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile -e '.[test]' $(TORCH_PIN)
	@# Bytecode for what bertforge imports only (pip would compile every file of the dependencies, one at a
	@# time), also where the host sets PYTHONDONTWRITEBYTECODE: without it each process compiles its imports.
	env -u PYTHONDONTWRITEBYTECODE $(PY) -c 'import bertforge.cli, bertforge.train.pretrain, bertforge.train.finetune'
	touch $@

demo: install
	$(VENV)/bin/bertforge demo

# the tests write the bytecode of their own imports (transformers, sentence-transformers) once, as above
test: install
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
