# The two commands of onnxfuse (each does all set-up on a fresh machine):
#   make demo   export the default Llama (seed preset, 1 layer), fuse it, verify it against PyTorch on the CPU
#   make test   run the test suite
# and for CI: make wheel-check   build the wheel, install it into a clean venv, build/doctor/export/fuse/verify from it
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL := models/llama-seed-1l-fp32

.PHONY: setup demo test wheel-check clean
setup: $(VENV)/.installed

# constraints.txt pins the tested versions (torch==2.13.0: on the CPU machines pip takes the local CPU build of it).
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[cpu,dev]' -c constraints.txt
	touch $@

demo: setup
	$(BIN)/onnxfuse export llama --layers 1 -o $(MODEL).onnx --force
	$(BIN)/onnxfuse fuse $(MODEL).onnx -o $(MODEL).fused.onnx --force
	$(BIN)/onnxfuse verify $(MODEL).fused.onnx

test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider

wheel-check:
	PYTHON=$(PYTHON) .ci/wheel-check

clean:
	rm -rf models/*.onnx models/*.onnx.data
	test ! -x $(BIN)/onnxfuse || $(BIN)/onnxfuse cache clean -q
