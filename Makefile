# The README's two commands: `make quickstart` and `make test`. Both include set-up.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch 2.13.0 has a CPU build on these machines' local disk; elsewhere pip takes it from PyPI.
TORCH_CPU ?= torch==2.13.0
# No KUBETUNE_HOME of its own: the quickstart's job goes where the kubetune in your shell looks for it (the
# default ~/.cache/kubetune, or your KUBETUNE_HOME), so `kubetune list` / `status quickstart` find it afterwards.

.PHONY: setup test-deps quickstart test bench clean constraints

$(BIN)/kubetune: pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@# Without a GPU, install the CPU build of torch first so the torch range does not pull CUDA wheels.
	@if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
	  echo "setup: no GPU found, installing the CPU build of torch"; \
	  $(BIN)/python -m pip install -q "$(TORCH_CPU)" || $(BIN)/python -m pip install -q --index-url https://download.pytorch.org/whl/cpu torch; \
	fi
	$(BIN)/python -m pip install -q -e ".[test]"
	@touch $@

setup: $(BIN)/kubetune

# System packages the tests use: Debian's OCI registry (docker-registry) and PostgreSQL (tests/server run the
# jobs service on it too), each started on 127.0.0.1 or a socket by a fixture; and headless Chromium with its
# WebDriver (chromium, chromium-driver) for the dashboard's browser tests (tests/server/test_dashboard.py).
test-deps:
	@if ! command -v docker-registry >/dev/null 2>&1 && [ ! -x /usr/bin/docker-registry ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "test-deps: installing docker-registry (Debian package)"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends docker-registry >/dev/null; \
	fi
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "test-deps: installing postgresql (Debian package)"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null; \
	fi
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "test-deps: installing chromium and chromium-driver (Debian packages)"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; \
	fi

QUESTION ?= What is the capital of France?
quickstart: setup
	@echo "== before fine-tuning: builtin://tiny-chat (random weights)"
	@$(BIN)/kubetune chat builtin://tiny-chat --prompt "$(QUESTION)" --max-new-tokens 12
	@rm -rf runs/quickstart
	$(BIN)/kubetune run examples/quickstart.yaml
	@echo "== after fine-tuning: runs/quickstart"
	@$(BIN)/kubetune chat runs/quickstart --prompt "$(QUESTION)"
	@$(BIN)/kubetune chat runs/quickstart --prompt "Which city is the capital of Japan?"

# Two processes (pytest-xdist), each taking whole test files: about 26 minutes instead of 40 on 2 cores.
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
test: setup test-deps
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# constraints.txt: the exact libraries the test suite passed with (no local build labels such as +cpu, so the
# CUDA image's torch matches too). The images install with it; regenerate after `make test` passes.
constraints: setup
	@$(BIN)/python -m pip freeze --exclude-editable --all | grep -v -E '^(kubetune|pip|setuptools|wheel)==' | sed -E 's/\+[A-Za-z0-9.]+$$//' | LC_ALL=C sort -f > constraints.txt
	@echo "wrote constraints.txt ($$(wc -l < constraints.txt) packages)"

bench: setup
	@# bench/gpu_*.py need an NVIDIA GPU: skipped (and said so) where nvidia-smi is missing.
	@for b in bench/[!_]*.py; do \
	  case $$b in bench/gpu_*) command -v nvidia-smi >/dev/null 2>&1 || { echo "== $$b: skipped, no GPU"; continue; };; esac; \
	  echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) runs
