# Suzumio developer commands. `make test` and `make demo` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME_STAMP := $(VENV)/.runtime-installed
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv test test-stress test-swarm test-real-model lint demo pex webui soak clean

# Runtime dependencies only (enough for `make demo`); the test and dev extras come on top.
$(RUNTIME_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(RUNTIME_STAMP)

$(STAMP): $(RUNTIME_STAMP)
	$(PY) -m pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

venv: $(STAMP)

# pytest exits 5 when it collected nothing: that is a broken suite, not a pass.
test: $(STAMP)
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: no tests were collected" >&2; exit 1; fi; \
	exit $$rc

# The crash, warm, SSE and end-to-end tests with one busy-loop helper per core saturating the CPU,
# STRESS_RUNS times (default 20); prints each run and the pass rate (scripts/stress.py).
test-stress: $(STAMP)
	$(PY) scripts/stress.py --runs $${STRESS_RUNS:-20} -- $(PYTEST_ARGS)
# The tests on a real Swarm: a lab of a manager and two workers (scripts/swarm-lab, root only) made
# for the run and removed after it, whatever the outcome. SWARM_LAB_NAME keeps parallel runs apart.
# The backend contract suite's swarm cases and the swarm leg of the team-repository end-to-end test run
# before tests/test_swarm_backend.py, whose last test takes a worker node down.
SWARM_LAB_NAME ?= suzumio-test
test-swarm: $(STAMP)
	scripts/swarm-lab up --workers 2 --name $(SWARM_LAB_NAME)
	@SUZUMIO_SWARM_LAB=/run/suzumio-lab/$(SWARM_LAB_NAME)/settings.env SUZUMIO_REQUIRE_SWARM=1 \
		$(PY) -m pytest -m swarm tests/test_swarm_lab.py tests/test_backend_contract.py tests/test_e2e_repository.py \
		tests/test_swarm_backend.py \
		$(PYTEST_ARGS); rc=$$?; \
	scripts/swarm-lab down --name $(SWARM_LAB_NAME); \
	if [ $$rc -eq 5 ]; then echo "make test-swarm: no tests were collected" >&2; exit 1; fi; \
	exit $$rc

# The tests on a real model: the offline lab (scripts/local-model, llama.cpp and a 1.5B model from the
# package registry, checksum-verified) started for the run and stopped after it, whatever the outcome.
# The model takes both cores while it answers: never run this beside the stress target.
LOCAL_MODEL_SETTINGS = $${SUZUMIO_LOCAL_MODEL_DIR:-$$HOME/.cache/suzumio-local-model}/settings.env
test-real-model: $(STAMP)
	scripts/local-model up
	@SUZUMIO_LOCAL_MODEL_SETTINGS=$(LOCAL_MODEL_SETTINGS) SUZUMIO_REQUIRE_REAL_MODEL=1 \
		$(PY) -m pytest -m real_model tests/test_real_model.py $(PYTEST_ARGS); rc=$$?; \
	scripts/local-model down; \
	if [ $$rc -eq 5 ]; then echo "make test-real-model: no tests were collected" >&2; exit 1; fi; \
	exit $$rc

# The main job: an offline team of agents (scripted provider; Docker when an engine and image exist).
demo: $(RUNTIME_STAMP)
	$(PY) scripts/demo.py $(DEMO_ARGS)

# One file to copy to a host: dist/suzumio.pex (Linux x86_64/aarch64, CPython 3.11/3.12).
pex: $(STAMP)
	$(PY) scripts/build-pex

lint: $(STAMP)
	$(PY) -m ruff check .

# Rebuild the committed WebUI bundle (webui_dist/) from webui/; needs Node and npm.
webui:
	npm ci --no-audit --no-fund
	npm run build

# Longer reliability runs: 20 crash trials that SIGKILL `suzumio serve` during a running team
# (bench/soak_crash.py), 20 minutes of demo teams on one controller with its descriptors, threads and
# memory checked for growth (bench/soak_teams.py), then the hostile-input suite with 5,000 examples
# per property.
soak: $(STAMP)
	$(PY) bench/soak_crash.py $(SOAK_ARGS)
	$(PY) bench/soak_teams.py --minutes $${SOAK_MINUTES:-20}
	SUZUMIO_FUZZ_EXAMPLES=$${SUZUMIO_FUZZ_EXAMPLES:-5000} $(PY) -m pytest -q tests/test_fuzz.py

clean:
	rm -rf $(VENV) dist build *.egg-info .pytest_cache
