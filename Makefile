# jaxscale — two commands on a fresh machine: `make bench` (the main job) and `make test`.
# Simulated devices are decided here (a process edge), never at library import.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEVICES ?= 8
export JAX_NUM_CPU_DEVICES ?= $(DEVICES)
BENCH_ARGS ?=
EXTRAS ?= dev
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),+,$(EXTRAS))
# `make bench` needs only the core packages: on a fresh machine it installs those (half the time
# of the dev extras); where any install is there already, it uses that.
BENCH_STAMP := $(or $(firstword $(wildcard $(VENV)/.installed-*)),$(VENV)/.installed-core)
PYTEST_ARGS ?=
# Two workers: the suite is dominated by XLA compiles, which run on one core each.
WORKERS ?= 2

.PHONY: install test test-slow test-all smoke bench bench-rl notebooks lint format clean

install: $(STAMP)

# Re-runs only when pyproject.toml changes. EXTRAS=dev,tpu-aot adds libtpu (TPU AOT compiles);
# the stamp names the extras ("core": none). uv (one wheel from PyPI, into the venv) installs
# them: it resolves, downloads and unpacks in parallel. The rule takes about 20 s for dev,tpu-aot
# with the bytecode compiled, where pip took about 40 s on 2 cores (docs/testing.md). Where uv
# cannot be installed or cannot reach an index (uv reads no pip.conf), pip installs as before.
SPEC = .$(if $(filter core,$*),,[$(subst +,$(comma),$*)])
$(VENV)/.installed-%: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	{ $(PY) -m pip install -q uv && \
	  $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e '$(SPEC)'; } || \
	{ echo "uv unavailable: installing with pip"; \
	  $(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q -e '$(SPEC)'; }
	touch $@

# The suite, under 6 minutes on 2 cores from a fresh clone. The long tests (marked slow: every
# mesh of the equivalence matrix, end-to-end runs, multi-process training, the README's
# commands) are `test-slow`; CI runs both.
# FAST selects among the others: CI's second Python line runs `not slow and not first_line`.
FAST ?= not slow
test: install
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -n $(WORKERS) -m "$(FAST)" $(PYTEST_ARGS)

# SLOW selects among the long tests: CI's second Python line runs `slow and not first_line`.
# The equivalence matrix runs in workers of its own, then the rest: on jax 0.10.2 a worker that
# had run other slow modules first twice died of SIGSEGV in XLA:CPU's compiler on a matrix case
# that passes in the matrix's own run (docs/testing.md). The rest goes out a module at a time
# (`--dist loadfile`): a module's shared set-up (a trained checkpoint, the RLHF learning runs'
# preparation) is made once, not once per worker, and no worker waits on another's.
SLOW ?= slow
test-slow: install
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -n $(WORKERS) -m "$(SLOW)" $(PYTEST_ARGS) tests/test_verify.py
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -n $(WORKERS) --dist loadfile -m "$(SLOW)" $(PYTEST_ARGS) \
		--ignore=tests/test_verify.py

test-all: install
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -n $(WORKERS) $(PYTEST_ARGS)

smoke: install
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -m smoke $(PYTEST_ARGS)

# The MoE rows and the pipeline suite (compiles: one core each) run one after the other beside
# the mesh table, and the context-parallel suite after the mesh table (the two lanes take about
# the same CPU time); their output follows the mesh table's, from
# results/bench_{experts,pipeline,context}.txt. The pipeline suite compiles each schedule at
# M = 8 (its checked rows) and 32 here, within the 4-minute budget; `jaxscale bench pipeline`
# alone sweeps M = 4, 8, 16, 32 (docs/pipeline.md).
bench: $(BENCH_STAMP)
	@mkdir -p results
	@echo "bench experts, pipeline: running beside the mesh table; bench context after it (their output follows)"
	@( JAX_PLATFORMS=cpu $(PY) -m jaxscale bench experts > results/bench_experts.txt 2>&1; e=$$?; \
	   JAX_PLATFORMS=cpu $(PY) -m jaxscale bench pipeline --sweep 8,32 > results/bench_pipeline.txt 2>&1; \
	   exit $$(( e || $$? )) ) & \
	pid=$$!; \
	JAX_PLATFORMS=cpu $(PY) -m jaxscale bench $(BENCH_ARGS); rc=$$?; \
	JAX_PLATFORMS=cpu $(PY) -m jaxscale bench context > results/bench_context.txt 2>&1; \
	rc=$$(( rc || $$? )); \
	wait $$pid; prc=$$?; \
	for f in experts pipeline context; do echo; cat results/bench_$$f.txt 2>/dev/null; done; \
	exit $$(( rc || prc ))

# jaxscale's PPO beside rejax's (installed into the venv as the rl-compare extra).
bench-rl:
	$(MAKE) install EXTRAS=dev,rl-compare
	JAX_PLATFORMS=cpu $(PY) -m jaxscale bench rl $(BENCH_ARGS)

# Write each notebooks/*.ipynb (what Colab opens) from its jupytext script; --update keeps the
# cell ids, so a diff shows only the cells that changed. Commit them without outputs.
notebooks: install
	$(PY) -m jupytext --to ipynb --update notebooks/*.py

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) .venv312 results .pytest_cache .ruff_cache .hypothesis *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
