# Quickstart: `make demo` (install + export + validate + profile), then `make test`. The demo's export writes the inlined
# copy too (--format onnx-inlined): the OpenVINO snippet of docs/guides/openvino.md reads it (tests/test_readme_snippets.py runs it).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# A matching torch/torchvision pair from the package registry (CUDA build; runs on CPU too).
# Do not let pip pick the CPU-only local torch file: timm then fails on torchvision::nms.
TORCH_PAIR := torch==2.14.1 torchvision==0.29.2
DEMO_DIR := artifacts/deit_small_tome_r16
# The local Triton Inference Server's environment (serving/README.md): nvidia-pytriton's tritonserver, numpy < 2.
SERVE_VENV := .venv-serve

.PHONY: install serve-env demo lint test slow extras-smoke ci coverage test-all gpu-bench device-kit clean docs browser-env docs-browser

install: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml setup.py Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(TORCH_PAIR) -e ".[test]"
	$(BIN)/python -c "import timm, torch, onnxruntime; print('installed torch', torch.__version__, 'timm', timm.__version__)"
	touch $@

serve-env: $(SERVE_VENV)/.installed

$(SERVE_VENV)/.installed: serving/requirements.txt
	rm -rf $(SERVE_VENV)
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/pip install --quiet --disable-pip-version-check -r serving/requirements.txt
	touch $@

demo: install
	$(BIN)/deploytk doctor
	$(BIN)/deploytk inspect
	$(BIN)/deploytk export --format onnx-inlined
	$(BIN)/deploytk validate $(DEMO_DIR)
	$(BIN)/deploytk profile $(DEMO_DIR) --batch-sizes 1,8

# The documentation site (docs/, mkdocs.yml) built into site/ with --strict: a broken link or a page missing from the
# nav fails. NO_MKDOCS_2_WARNING: mkdocs-material's banner about MkDocs 2, which deploytk does not use (pinned < 2).
# The docs need only the [docs] extra: mkdocstrings reads the API's docstrings from the source (griffe), imports none of
# it, so the venv has no torch and installs in seconds.
DOCS_VENV := .venv-docs
docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

$(DOCS_VENV)/.installed: pyproject.toml
	rm -rf $(DOCS_VENV)
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install --quiet --disable-pip-version-check $$($(PYTHON) scripts/extra_requirements.py docs)
	touch $@

# A real headless browser for the site: Debian's chromium (apt-get, as root; playwright's own browser download needs the
# internet) and playwright to drive it. The slow tier needs it (tests/test_docs.py's browser test).
browser-env: install
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)
	$(BIN)/pip install -q "playwright>=1.40"

# The site in that browser (scripts/docs_screenshot.py): home page, a guide and the API reference render with their
# navigation, the search finds "ToMeMatch"; writes the home page's screenshot to docs/assets/home.png.
docs-browser: browser-env
	$(BIN)/pip install -q -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/python scripts/docs_screenshot.py

# Lint: ruff (rules and formatting), the import-layer contract in pyproject.toml (import-linter) and mypy --strict on the
# public API (deploytk/__init__.py, deploytk/api/; [tool.mypy] in pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# pytest on both cores: two xdist workers, each pinned to its own CPU with one thread (tests/conftest.py), the exports
# shared between them (tests/helpers/exports.py). The default suite keeps a test file's tests on one worker (its module
# fixtures made once); the slow tier is mostly one file's parametrized configs, so its tests are dealt out one by one,
# and an idle worker steals from the other's queue (worksteal): with `load` the first deal is fixed, and once the op sweep's
# 1,700 short cases joined the tier, one worker was dealt every large config and ran them alone for 40 minutes.
# pytest's exit 5 (no tests ran) fails. The serving tests run a real tritonserver from $(SERVE_VENV); under `test`,
# `slow` and `ci` they fail rather than skip when it cannot start.
WORKERS ?= 2
PYTEST := DEPLOYTK_REQUIRE_SERVER=1 $(BIN)/python -m pytest -q -n $(WORKERS)
DEFAULT_TESTS := --dist loadfile -m "not slow and not gpu and not trt"
SLOW_TESTS := --dist worksteal -m "slow and not gpu and not trt"
COVERAGE := --cov=deploytk --cov=deploytk_plugins --cov=serving --cov-report=term:skip-covered
define run_pytest
	$(PYTEST) $(1); rc=$$?; if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc
endef

# The quick check (README, Quickstart): lint, then the default suite (CPU only; no slow, GPU or TensorRT tests). At most 12 minutes.
test: lint serve-env
	$(call run_pytest,$(DEFAULT_TESTS))

# The slow tier: every shipped config, official-code equality on every model size, large models, load in thousands.
slow: install serve-env browser-env
	DEPLOYTK_REQUIRE_BROWSER=1 $(call run_pytest,$(SLOW_TESTS))

# Every extra on its own: core, [openvino], [int8], [hf] and [serve] each in a fresh venv of the torch pair and that
# extra alone, with its smoke command (scripts/extras_smoke.sh). The suite's venv has [test], whose tritonclient pins
# protobuf below 7: a bare `pip install -e ".[openvino]"` resolves protobuf 7, which only this sees.
extras-smoke:
	PYTHON=$(PYTHON) TORCH_PAIR="$(TORCH_PAIR)" scripts/extras_smoke.sh

# The quick check, the slow tier, then every extra on its own: what .ci/run runs, at most 60 minutes (CONTRIBUTING.md
# has the times).
ci: test slow extras-smoke

# Line coverage of deploytk/, plugins/ and serving/ under the default suite (`make coverage TESTS=` for every CPU test).
TESTS ?= $(DEFAULT_TESTS)
coverage: install serve-env
	$(call run_pytest,$(TESTS) $(COVERAGE))

test-all: install
	$(BIN)/python -m pytest -q

# On a CUDA GPU: native kernel selftest, kernel-vs-bandwidth and end-to-end latency, JSON under benchmarks/results/.
METHOD_CONFIGS := export_configs/deit_small_mctf_r16.yaml,export_configs/deit_small_atm_calibrated.yaml,export_configs/deit_small_evit_k70.yaml,export_configs/deit_small_crucial_k70.yaml
gpu-bench: install
	$(BIN)/deploytk selftest --json > benchmarks/results/selftest_gpu.json; rc=$$?; cat benchmarks/results/selftest_gpu.json | head -c 400; echo; \
	  $(BIN)/python benchmarks/kernel_bandwidth.py && $(BIN)/python benchmarks/end_to_end_latency.py --cuda-graphs --configs $(METHOD_CONFIGS) && exit $$rc

# The GPU check's kit (CONTRIBUTING.md, "The GPU check"): the wheels the GPU machine's image lacks, pinned in
# scripts/device_kit.txt, and deploytk's own wheel, in device-kit/ (git-ignored) for the device tool to carry.
device-kit: install
	$(BIN)/python scripts/device_kit.py --output device-kit

clean:
	rm -rf artifacts .pytest_cache $(SERVE_VENV) $(DOCS_VENV)
