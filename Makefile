# Two commands on a fresh machine: `make demo` and `make test`.
# torch is pinned here (and only here) so that pip never picks another multi-GB build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
# `make test` runs the tests in parallel (pytest-xdist), one worker per core up to 4; each worker and the
# bertforge processes it starts share its part of the cores (BERTFORGE_THREADS, tests/conftest.py).
# TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ "$$n" -gt 4 ] && n=4; echo $$n)

.PHONY: demo test install clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile $(TORCH_PIN)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile -e '.[test]' $(TORCH_PIN)
	@# the bytecode pip would write one file at a time, on every core: half the install on two cores.  Like
	@# pip's, it skips the files that do not compile (templates, Python 2 leftovers in some packages).
	$(PY) -m compileall -q -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null || true
	touch $@

demo: install
	$(VENV)/bin/bertforge demo

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
