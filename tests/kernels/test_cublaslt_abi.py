"""cuda/cublaslt_api.h declares the part of cuBLASLt's C ABI the CUDA backend calls (it loads libcublasLt with dlopen,
so the build needs no cuBLAS headers). Where a real cublasLt.h is found, compile both side by side and assert every
enum value, struct size and function signature is the same; and the built library must not link libcublas."""
from __future__ import annotations

import glob
import importlib
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

kbuild = importlib.import_module("onnxfuse.kernels.build")
KERNELS = pathlib.Path(__file__).resolve().parents[2] / "onnxfuse" / "kernels"


def _cuda_include() -> pathlib.Path | None:
    nvcc = kbuild.find_nvcc()
    roots = [nvcc.resolve().parents[1]] if nvcc else []
    roots += [pathlib.Path(p) for p in sorted(glob.glob("/usr/local/cuda*"), reverse=True)]
    for root in roots:
        if (root / "include" / "cuda_runtime_api.h").is_file():
            return root / "include"
    return None


def _cublaslt_include() -> pathlib.Path | None:
    """$ONNXFUSE_CUBLASLT_INCLUDE, the CUDA toolkit's include dir, or an nvidia-cublas wheel's (cu13, cu12)."""
    cands = [os.environ.get("ONNXFUSE_CUBLASLT_INCLUDE")]
    inc = _cuda_include()
    cands.append(str(inc) if inc else None)
    for sp in sys.path:
        cands += [f"{sp}/nvidia/cu13/include", f"{sp}/nvidia/cublas/include"]
    for c in cands:
        if c and (pathlib.Path(c) / "cublasLt.h").is_file():
            return pathlib.Path(c)
    return None


CHECK = r"""
#include <cublasLt.h>
#include <type_traits>
#include "cuda/cublaslt_api.h"
namespace lt = onnxfuse::cublaslt;
static_assert(lt::kStatusSuccess == CUBLAS_STATUS_SUCCESS && lt::kStatusNotSupported == CUBLAS_STATUS_NOT_SUPPORTED);
static_assert(lt::kCompute32F == CUBLAS_COMPUTE_32F && lt::kOpN == CUBLAS_OP_N);
static_assert(lt::kDescTransA == CUBLASLT_MATMUL_DESC_TRANSA && lt::kDescTransB == CUBLASLT_MATMUL_DESC_TRANSB);
static_assert(lt::kDescEpilogue == CUBLASLT_MATMUL_DESC_EPILOGUE);
static_assert(lt::kDescBiasPointer == CUBLASLT_MATMUL_DESC_BIAS_POINTER);
static_assert(lt::kEpilogueDefault == CUBLASLT_EPILOGUE_DEFAULT && lt::kEpilogueRelu == CUBLASLT_EPILOGUE_RELU);
static_assert(lt::kEpilogueBias == CUBLASLT_EPILOGUE_BIAS && lt::kEpilogueReluBias == CUBLASLT_EPILOGUE_RELU_BIAS);
static_assert(lt::kPrefMaxWorkspaceBytes == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
static_assert(lt::kPrefMinAlignmentABytes == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES);
static_assert(lt::kPrefMinAlignmentBBytes == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES);
static_assert(lt::kPrefMinAlignmentCBytes == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES);
static_assert(lt::kPrefMinAlignmentDBytes == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES);
static_assert(sizeof(lt::MatmulAlgo) == sizeof(cublasLtMatmulAlgo_t));
static_assert(sizeof(lt::HeuristicResult) == sizeof(cublasLtMatmulHeuristicResult_t));
static_assert(offsetof(lt::HeuristicResult, workspaceSize) == offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize));
static_assert(offsetof(lt::HeuristicResult, state) == offsetof(cublasLtMatmulHeuristicResult_t, state));
static_assert(sizeof(lt::Status) == sizeof(cublasStatus_t) && sizeof(lt::Handle) == sizeof(cublasLtHandle_t));
// The functions: called with the arity and argument kinds cuda/gemm.cu's pointer types declare (the handles are
// void* there, struct pointers here).
void check() {
  static_assert(std::is_same_v<decltype(cublasLtMatmulDescCreate(nullptr, CUBLAS_COMPUTE_32F, CUDA_R_32F)),
                               cublasStatus_t>);
  static_assert(std::is_same_v<decltype(cublasLtMatrixLayoutCreate(nullptr, CUDA_R_16F, 1, 1, 1)), cublasStatus_t>);
  static_assert(std::is_same_v<decltype(cublasLtGetVersion()), size_t>);
  cublasLtMatmulHeuristicResult_t r[1];
  int n = 0;
  (void)cublasLtMatmulAlgoGetHeuristic(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, r, &n);
  (void)cublasLtMatmul(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                       nullptr, nullptr, nullptr, nullptr, 0, nullptr);
  (void)cublasLtMatmulDescSetAttribute(nullptr, CUBLASLT_MATMUL_DESC_EPILOGUE, nullptr, 0);
  (void)cublasLtMatmulPreferenceSetAttribute(nullptr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, nullptr, 0);
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_our_cublaslt_declarations_match_the_real_header(tmp_path):
    real, cuda = _cublaslt_include(), _cuda_include()
    if real is None or cuda is None:
        pytest.skip("no cublasLt.h here (set ONNXFUSE_CUBLASLT_INCLUDE to check against one)")
    src = tmp_path / "abi.cc"
    src.write_text(CHECK)
    p = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{real}", f"-I{cuda}", f"-I{KERNELS}", str(src)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]


def test_a_wrong_declaration_is_caught(tmp_path):
    """The check above can fail: the same static_asserts against a header with one value changed do not compile."""
    real, cuda = _cublaslt_include(), _cuda_include()
    if real is None or cuda is None or shutil.which("g++") is None:
        pytest.skip("no cublasLt.h or g++ here")
    bad = tmp_path / "cuda"
    bad.mkdir()
    text = (KERNELS / "cuda" / "cublaslt_api.h").read_text()
    assert "kEpilogueReluBias = 6;" in text
    (bad / "cublaslt_api.h").write_text(text.replace("kEpilogueReluBias = 6;", "kEpilogueReluBias = 5;"))
    src = tmp_path / "abi.cc"
    src.write_text(CHECK)
    p = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{real}", f"-I{cuda}", f"-I{tmp_path}", str(src)],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "static assertion failed" in p.stderr
