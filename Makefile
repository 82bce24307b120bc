# trainfleet: `make setup` once, then `make test`. Everything lives in .venv inside the repo.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The node's software at exact versions (trainer/node-pins.txt); pip's constraints take no [extras].
PINS := trainer/node-pins.txt
VERSION_OF = $(shell sed -n 's/^$(1)\(\[[^]]*\]\)\{0,1\}==//p' $(PINS))
# The CPU build of torch that lies on this machine's disk; installed first so that nothing pulls a CUDA build.
TORCH  ?= torch==$(call VERSION_OF,torch)
# No bytecode while pip installs: of the venvs' 8 GB of Python the tests import a small part, and Python
# writes each module's bytecode on its first import. Where PYTHONDONTWRITEBYTECODE is set (as in this CI)
# it would never write it and pay the compile on every import, so the recipes run without it. (Compiling
# all three venvs up front took 5 min of the CI's setup.)
PIP_FLAGS ?= --no-compile
unexport PYTHONDONTWRITEBYTECODE
# $(call PIP,VENV,WHAT): pip install into VENV, tried once more when a download is cut short.
PIP = $(1)/bin/pip install -q $(PIP_FLAGS) $(2) || $(1)/bin/pip install -q $(PIP_FLAGS) $(2)

.PHONY: setup sandbox-tool test-tools fleet-env node-env axolotl-env axolotl-venv control-env node-pins lint format typecheck test test-unit test-integration faults check bench demo flower clean

# The four environments at once (pip mostly waits on downloads); the control plane's after the fleet's,
# since both build the package in this tree. A download cut short is tried again once.
setup: sandbox-tool
	@$(MAKE) --no-print-directory -j3 fleet-env node-env axolotl-env
	@$(MAKE) --no-print-directory control-env
	@$(BIN)/fleet --help >/dev/null && echo "setup done: $(BIN)/fleet is ready"

# Local nodes run in bubblewrap (providers/local/sandbox.py). As root with apt (a fresh machine, CI), setup installs
# it; otherwise it says how (and `fleet run` refuses a local job until it is there, or FLEET_LOCAL_SANDBOX=none).
sandbox-tool:
	@command -v bwrap >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  { apt-get install -y -q bubblewrap || { apt-get update -q && apt-get install -y -q bubblewrap; }; } >/dev/null \
	  && echo "installed bubblewrap (bwrap): local nodes run in it"; \
	else \
	  echo "note: local nodes run in bubblewrap, which is not installed: apt install bubblewrap (or set FLEET_LOCAL_SANDBOX=none to run them as yourself)"; \
	fi

NODE_CONSTRAINTS := out/node-constraints.txt
$(NODE_CONSTRAINTS): $(PINS)
	@mkdir -p $(dir $@)
	sed 's/\[[^]]*\]//' $(PINS) > $@

# The fleet's own environment: the control plane, the node's software at the pins (the tests train on this
# CPU and import the trainer) and the tools.
fleet-env: $(NODE_CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(PIP_FLAGS) --upgrade pip
	$(call PIP,$(VENV),"$(TORCH)")
	$(call PIP,$(VENV),-e ".[dev]" -c $(NODE_CONSTRAINTS))
	@echo "fleet env done: $(BIN)/python"

# The nodes' own environment: only the node's software, exactly as a rented node's start script installs it
# (trainer/node-pins.txt). Local and fake-cloud nodes run in it, never in the fleet's .venv, so a node that
# lacks something the trainer needs fails here as it would on a rental.
NODE_VENV := .venv-node

node-env:
	test -x $(NODE_VENV)/bin/python || $(PYTHON) -m venv $(NODE_VENV)
	$(NODE_VENV)/bin/pip install -q $(PIP_FLAGS) --upgrade pip
	$(call PIP,$(NODE_VENV),"$(TORCH)")
	$(call PIP,$(NODE_VENV),-r $(PINS))
	@echo "node env done: $(NODE_VENV)/bin/python"

# The local nodes' environment for axolotl jobs, as axolotl's image has it: axolotl at the fleet's default
# release (core.node_settings.DEFAULT_AXOLOTL_VERSION) with its own pins of torch, transformers and peft (the CPU
# torch here), plus the fleet's Ray. Never the fleet's .venv: axolotl pins versions the fleet does not run.
AXOLOTL_VENV := .venv-axolotl
AXOLOTL_VERSION ?= $(shell sed -n 's/^DEFAULT_AXOLOTL_VERSION = "\(.*\)"/\1/p' core/node_settings.py)
AXOLOTL_SET = "axolotl==$(AXOLOTL_VERSION)" "$(shell grep -E '^ray(\[|==)' $(PINS))" "$(TORCH)"

# axolotl 0.19 pins zstandard 0.22.0, which has no Python 3.13 build and does not compile there: on 3.13
# this environment is skipped, saying so (local axolotl jobs then need AXOLOTL_PYTHON=python3.12 or 3.11).
AXOLOTL_PYTHON ?= $(PYTHON)

axolotl-env:
	@if $(AXOLOTL_PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 13))'; then \
	  echo "axolotl env skipped: axolotl $(AXOLOTL_VERSION) does not install on $$($(AXOLOTL_PYTHON) -V) (its pin zstandard==0.22.0 does not build there); for local axolotl jobs: make axolotl-env AXOLOTL_PYTHON=python3.12"; \
	  exit 0; fi; \
	$(MAKE) --no-print-directory axolotl-venv

axolotl-venv:
	test -x $(AXOLOTL_VENV)/bin/python || $(AXOLOTL_PYTHON) -m venv $(AXOLOTL_VENV)
	$(AXOLOTL_VENV)/bin/pip install -q $(PIP_FLAGS) --upgrade pip
	$(call PIP,$(AXOLOTL_VENV),"$(TORCH)")
	$(call PIP,$(AXOLOTL_VENV),$(AXOLOTL_SET))
	@echo "axolotl env done: $(AXOLOTL_VENV)/bin/python (axolotl $(AXOLOTL_VERSION))"

# The control plane alone, as the compose images install it (`pip install .`: no torch, transformers or
# peft); tests/integration/test_control_install.py runs the CLI from it.
CONTROL_VENV := .venv-control

control-env: $(NODE_CONSTRAINTS)
	test -x $(CONTROL_VENV)/bin/python || $(PYTHON) -m venv $(CONTROL_VENV)
	$(CONTROL_VENV)/bin/pip install -q $(PIP_FLAGS) --upgrade pip
	$(call PIP,$(CONTROL_VENV),-e . -c $(NODE_CONSTRAINTS))
	@echo "control env done: $(CONTROL_VENV)/bin/fleet"

# trainer/node-pins.txt again from trainer/requirements-node.txt's ranges, as pip resolves them today.
node-pins:
	$(BIN)/pip install -q --dry-run --ignore-installed --report out/node-report.json -r trainer/requirements-node.txt
	$(BIN)/python -m providers.bootstrap out/node-report.json

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format:
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck:
	$(BIN)/mypy

# Unit and security tests two at a time (they leave a core idle otherwise); the integration and fault tests
# two at a time too, but tests/scheduling.py (picked up by tests/conftest.py) runs the tests that train
# (conftest's TRAINING_MODULES) one at a time while other tests are left to run beside them, and two at once
# only after that, never beside one of ALONE_MODULES; a module's tests stay on one worker.
# The whole fault suite runs here too, its long cases (faults_full) included: `-m` on the command line
# overrides pyproject's addopts, which leaves them out of a plain `pytest`. (`make faults` runs the fault
# suite alone, in one process, and prints its summary.)
# What the tests need beside the environments: an OpenSSH server (tests/sshd.py starts its own, on loopback,
# for the pool machines of providers.ssh). As root with apt it is installed; otherwise this says how.
test-tools:
	@[ -x /usr/sbin/sshd ] && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server; }; } >/dev/null \
	  && echo "installed openssh-server: the pool tests start their own sshd"; \
	else \
	  echo "note: the pool tests start sshd, which is not installed: apt install openssh-server"; \
	fi

test: test-tools
	$(BIN)/pytest -q --durations=5 -n 2 tests/unit tests/security
	$(BIN)/pytest -q --durations=25 -n 2 -m "faults_full or not faults_full" tests/integration tests/faults

test-unit:
	$(BIN)/pytest -q tests/unit

test-integration:
	$(BIN)/pytest -q tests/integration

# The whole fault-injection suite (tests/faults: also the long cases that `make test` leaves out), then its
# summary as one JSON object on the last line; fails if a case failed or anything leaked, was duplicated,
# never ended or let a secret out.
FAULTS_SUMMARY ?= out/faults-summary.json

faults:
	@mkdir -p $(dir $(FAULTS_SUMMARY)); rm -f $(FAULTS_SUMMARY)
	@FLEET_FAULTS_SUMMARY=$(abspath $(FAULTS_SUMMARY)) $(BIN)/pytest -q -m faults tests/faults; status=$$?; \
		$(BIN)/python -m tests.faults.summary $(FAULTS_SUMMARY) || status=1; exit $$status

check: lint typecheck test

bench:
	$(BIN)/python bench/overhead.py

demo:
	$(BIN)/fleet run configs/examples/tiny-lora.yml

# Flower on this machine's fleet: http://127.0.0.1:5555 (its API too, at /api/tasks).
flower:
	$(BIN)/fleet flower

# The node image (docker/node.Dockerfile): the node's software over PyTorch's CUDA runtime image of the
# fleet's torch, at the fleet's exact versions (providers.bootstrap.node_pins: a node whose image has them
# installs nothing at start; Ray's must equal the fleet's). Other base: NODE_BUILD_ARGS="--build-arg
# CUDA_VERSION=13.0". To use it, push it where the providers can pull it and name it in a job's section:
#   docker tag $(NODE_IMAGE) REGISTRY/trainfleet-node:VERSION && docker push REGISTRY/trainfleet-node:VERSION
#   runpod: (or vastai:)   image: REGISTRY/trainfleet-node:VERSION
# (a private registry also needs its credentials at the provider).
FLEET_VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)
NODE_IMAGE ?= trainfleet-node:$(FLEET_VERSION)
NODE_PINS ?= $(shell sed -n '/^[^#]/p' $(PINS) | tr '\n' ' ')
NODE_BUILD_ARGS ?=

.PHONY: node-image
node-image:
	docker build -f docker/node.Dockerfile -t $(NODE_IMAGE) --build-arg TRAINFLEET_VERSION=$(FLEET_VERSION) \
		$(if $(call VERSION_OF,torch),--build-arg TORCH_VERSION=$(call VERSION_OF,torch)) \
		$(if $(call VERSION_OF,ray),--build-arg RAY_VERSION=$(call VERSION_OF,ray)) \
		$(if $(NODE_PINS),--build-arg NODE_PINS="$(NODE_PINS)") $(NODE_BUILD_ARGS) .

clean:
	rm -rf $(VENV) $(NODE_VENV) $(AXOLOTL_VENV) $(CONTROL_VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
