# trainfleet: `make setup` once, then `make test`. Everything lives in .venv inside the repo.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU build of torch that lies on this machine's disk; installed first so that nothing pulls a CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: setup lint format typecheck test test-unit test-integration faults check bench demo flower clean

setup: $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	@$(BIN)/fleet --help >/dev/null && echo "setup done: $(BIN)/fleet is ready"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format:
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck:
	$(BIN)/mypy

test:
	$(BIN)/pytest -q --durations=15

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

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
