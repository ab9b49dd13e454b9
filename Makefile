# Quickstart: `make demo` (install + export + validate + profile), then `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# A matching torch/torchvision pair from the package registry (CUDA build; runs on CPU too).
# Do not let pip pick the CPU-only local torch file: timm then fails on torchvision::nms.
TORCH_PAIR := torch==2.14.1 torchvision==0.29.2
DEMO_DIR := artifacts/deit_small_tome_r16
# The local Triton Inference Server's environment (serving/README.md): nvidia-pytriton's tritonserver, numpy < 2.
SERVE_VENV := .venv-serve

.PHONY: install serve-env demo lint test test-all gpu-bench clean

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
	$(BIN)/deploytk export
	$(BIN)/deploytk validate $(DEMO_DIR)
	$(BIN)/deploytk profile $(DEMO_DIR) --batch-sizes 1,8

# Lint: ruff (rules and formatting) and the import-layer contract in pyproject.toml (import-linter).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# Default suite: lint, then CPU-only tests, no slow/GPU/TensorRT ones. pytest's exit 5 (no tests ran) fails.
# The serving tests run a real tritonserver from $(SERVE_VENV); here they fail rather than skip when it cannot start.
test: lint serve-env
	DEPLOYTK_REQUIRE_SERVER=1 $(BIN)/python -m pytest -m "not slow and not gpu and not trt" -q; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc

test-all: install
	$(BIN)/python -m pytest -q

# On a CUDA GPU: native kernel selftest, kernel-vs-bandwidth and end-to-end latency, JSON under benchmarks/results/.
METHOD_CONFIGS := export_configs/deit_small_mctf_r16.yaml,export_configs/deit_small_atm_calibrated.yaml,export_configs/deit_small_evit_k70.yaml,export_configs/deit_small_crucial_k70.yaml
gpu-bench: install
	$(BIN)/deploytk selftest --json > benchmarks/results/selftest_gpu.json; rc=$$?; cat benchmarks/results/selftest_gpu.json | head -c 400; echo; \
	  $(BIN)/python benchmarks/kernel_bandwidth.py && $(BIN)/python benchmarks/end_to_end_latency.py --configs $(METHOD_CONFIGS) && exit $$rc

clean:
	rm -rf artifacts .pytest_cache $(SERVE_VENV)
