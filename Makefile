# Each target does all set-up it needs on a fresh machine (a local .venv), then runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# One torch thread per process: on small CPUs this is faster and far steadier than torch's default.
export TINKERTRACE_CPU_THREADS ?= 1

# The OpenAI Agents SDK example runs its agent workers in their own environment (newer openai-agents
# need starlette>=1.3, older ones openai<3; see its README): tinkertrace core + its requirements, no torch.
AGENTS_VENV := .venv-agents
AGENTS_STAMP := $(AGENTS_VENV)/.installed

# The adapter tests run the real instrumentation packages (OpenInference, OpenLLMetry, the official GenAI
# instrumentation, Logfire) in their own environment: tinkertrace core + tests/instrumentations/requirements.txt.
INSTRUMENTATIONS_VENV := .venv-instrumentations
INSTRUMENTATIONS_STAMP := $(INSTRUMENTATIONS_VENV)/.installed

.PHONY: setup demo test lint bench agents-env instrumentations-env

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade "pip>=24"
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[engine,collector,dev]"
	# compile the collector's span-scan and page-gather kernels once (numba caches them next to the modules)
	$(BIN)/python -c "from tinkertrace.spanstore.convert import warm_up_kernels; warm_up_kernels()"
	touch $(STAMP)

setup: $(STAMP)

$(AGENTS_STAMP): pyproject.toml examples/agents_sdk/requirements.txt
	$(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_VENV)/bin/pip install --quiet --upgrade "pip>=24"
	$(AGENTS_VENV)/bin/pip install --quiet -e . -r examples/agents_sdk/requirements.txt
	touch $(AGENTS_STAMP)

agents-env: $(AGENTS_STAMP)

$(INSTRUMENTATIONS_STAMP): pyproject.toml tests/instrumentations/requirements.txt
	$(PYTHON) -m venv $(INSTRUMENTATIONS_VENV)
	$(INSTRUMENTATIONS_VENV)/bin/pip install --quiet --upgrade "pip>=24"
	$(INSTRUMENTATIONS_VENV)/bin/pip install --quiet -e . -r tests/instrumentations/requirements.txt
	touch $(INSTRUMENTATIONS_STAMP)

instrumentations-env: $(INSTRUMENTATIONS_STAMP)

demo: $(STAMP)
	$(BIN)/tinkertrace demo

test: $(STAMP) $(AGENTS_STAMP) $(INSTRUMENTATIONS_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
