"""What `fuse --provider cpu` leaves to onnxruntime, per host family: the CPU kernels' measured losses.

The CPU kernels pick their code at run time by the host's vector ISA (host.FAMILIES), and how they compare with
onnxruntime's own MLAS kernels differs by family: oneDNN's fp32 matmul is a brgemm kernel with AVX-512 and its older
gemm:jit kernel without. CPU_LEFT_TO_ORT lists, per family, the patterns whose fused op measured slower than the
unfused graph there, each with its measurement. The bench's fused-cpu variant is what this gives a host; its
fused-cpu-all variant (every pattern fused) is the evidence for the next revision.
"""
from __future__ import annotations

import os


from .errors import OnnxfuseError

# Patterns whose CPU kernel measured slower than onnxruntime's own path (MLAS) on the CPU EP, per host family (the
# CPU kernels' vector ISA, host.FAMILIES): fuse(provider="cpu") leaves them to onnxruntime on a host of that family
# (an explicit --patterns list still fuses them). Each reason names the measurement; a family nobody has measured
# leaves every GEMM pattern to onnxruntime. The bench's fused-cpu variant is what this table gives a host, and its
# fused-cpu-all variant (every pattern fused) is the evidence for the next revision of it.
_CPU_GEMM_PATTERNS = ("swiglu", "linear_act", "mlp_stack", "lora_linear")
CPU_LEFT_TO_ORT: dict[str, dict[str, str]] = {
    "avx512": {
        "swiglu": "the CPU SwiGLU kernel (two oneDNN GEMMs per tile) measured 0.83-0.93x of onnxruntime's MLAS "
                  "MatMuls + Sigmoid/Mul on a 2-core Sapphire Rapids (benchmarks/results/cpu-2core-2026-11-23/)",
        "linear_act": "fp32 Linear+activation layers: oneDNN and MLAS both run at ~90% of the FMA peak, and the fused "
                      "DLRM MLPs measured 0.80-0.96x of onnxruntime on a 2-core Sapphire Rapids (same results)",
        "mlp_stack": "chains linear_act nodes, which are left to onnxruntime on the CPU",
    },
    "avx2": {
        "swiglu": "without AVX-512, oneDNN 3.2's fp32 matmul is its gemm:jit kernel, not brgemm: the fused Llama MLP "
                  "measured 0.75-0.88x, GeGLU 0.81-0.89x and Phi-3 0.78-0.89x of onnxruntime on 2-core AMD EPYCs "
                  "(benchmarks/results/cpu-avx2-2026-11-25/)",
        "linear_act": "MLAS runs fp32 GEMMs at 90-100% of the FMA peak on a 2-core AMD EPYC (Zen 1: family 23, "
                      "model 1): the DLRM bottom MLP as one MLPStack measured 0.97-0.98x and the top 0.94-0.95x of "
                      "onnxruntime, and the whole DLRM was faster with both left to onnxruntime "
                      "(benchmarks/results/cpu-avx2-2026-11-25/)",
        "mlp_stack": "chains linear_act nodes, which are left to onnxruntime on the CPU",
        "lora_linear": "the LoRA linear (64 x 256 x 256, rank 16) measured 0.90x of onnxruntime's MLAS MatMuls on a "
                       "2-core AMD EPYC (Zen 1), 1.43x on an earlier one (benchmarks/results/cpu-avx2-2026-11-25/): "
                       "left to onnxruntime where it can lose",
    },
    "generic": {**{p: "not measured on a host without AVX2: left to onnxruntime's MLAS" for p in _CPU_GEMM_PATTERNS},
                "cached_attention": "CachedAttention's decode loop (8-wide vectors: one AVX2 or AVX-512 register, two "
                                    "SSE ones here) was measured on AVX-512 hosts only: left to onnxruntime's "
                                    "GroupQueryAttention on a host without AVX2"},
}


# Patterns left to onnxruntime on every CPU host, whatever its family and threads.
CPU_ALWAYS_LEFT_TO_ORT: dict[str, str] = {
    "flash_attention": "FlashAttention's CPU kernel is a plain loop (every score, fp32) that serves a fused model "
                       "placed on the CPU; onnxruntime's CPU MultiHeadAttention runs its GEMMs on MLAS, and the op's "
                       "gain is the GPU kernel's skipping of masked key tiles",
    "int4_linear": "onnxruntime's CPU MatMulNBits (MLAS: X quantized to int8 and int8 dot products at accuracy "
                   "level 4, what genai's builder writes) measured 3.5-9x faster than Int4Linear's CPU kernel "
                   "(SmolLM2-135M's five int4 projections at 1, 4 and 64 rows on a 2-core AMD EPYC, AVX-512), and "
                   "5.6-7.7x faster than Int4SwiGLU's + Int4Linear's on its int4 MLP "
                   "(benchmarks/results/cpu-avx512-2core-2026-11-26/int4-linear-cpu.txt): the CPU kernels serve a "
                   "fused model placed on the CPU, the GPU kernels are where the ops win",
    "linear": "onnxruntime's MatMul at one row (MLAS) read SmolLM2's decode weights at 35-61 GB/s against 30-43 for a "
              "plain AVX-512 GEMV split over N or K on a 2-core AMD EPYC "
              "(benchmarks/results/cpu-avx512-2core-2026-11-27/decode-matmul-vs-gemv.txt): no faster CPU kernel to "
              "substitute; Linear's CPU kernel serves a fused model placed on the CPU",
}


# Patterns left to onnxruntime where the target is not the CPU (fuse(provider="cuda"), or no provider named) unless
# --patterns names them: ops whose GPU kernels have not been measured faster than onnxruntime's in a whole model.
# None now. cached_attention fuses on the CUDA provider (genai's 32-layer 7B-shape model decoded 1.06-1.12x faster
# than with SwiGLU and Embedding fused alone, benchmarks/results/h200-2026-11-29/generate/genai-L32-ca2.json), grouped
# query heads too since its decode kernel runs a block per query head (attention/decode-per-head-final-probe.txt);
# linear since its GEMV's counters need no memset (the same model decoded 1.023-1.031x faster with it than without,
# generate/genai-L32-linear-slots.json; with a memset a call it was no faster, genai-L32-linear.json).
GPU_LEFT_TO_ORT: dict[str, str] = {}


# Stage 1 (onnxruntime's own fusions) for the CPU provider: the fusions fuse(provider="cpu") leaves out, each with its
# measurement. The bench's ort-optimized variant keeps them all (onnxruntime's best as onnxscript applies it), so
# the fused-cpu variant is measured against it.
CPU_STAGE1_LEFT_OUT: dict[str, str] = {
    "sdpa": "onnxruntime's CPU MultiHeadAttention (what the attention fusion makes) measured slower than the unfused "
            "attention: without it the llama-7b case's stage-1 model ran 1.08-1.09x faster on a 2-core AMD EPYC "
            "(AVX2) and 1.11-1.26x on a 16-core Xeon (AVX-512), at 1 to 16 threads (64 tokens, 4 heads of 16; "
            "benchmarks/results/cpu-avx2-2026-11-25/stage1-ablation.txt, "
            "cpu-avx512-16t-2026-11-25/stage1-ablation.txt)",
}


# Families whose table holds only on small hosts: the avx512 entries were measured on 2 cores of a Sapphire Rapids;
# on a 16-thread one every GEMM pattern but the LoRA linear won (SwiGLU 1.15-2.36x, the DLRM MLPs 1.18-2.10x, whole
# DLRM 2.07-2.22x unfused onnxruntime: benchmarks/results/cpu-avx512-16t-2026-11-25/), so past this many threads the
# family's CPU_LEFT_TO_ORT_MANY_THREADS table applies instead.
CPU_TABLE_MAX_THREADS: dict[str, int] = {"avx512": 4}
CPU_LEFT_TO_ORT_MANY_THREADS: dict[str, dict[str, str]] = {
    "avx512": {
        "lora_linear": "the Llama MLP with rank-16 LoRA on gate, up and down (three LoRALinear, hidden 256, "
                       "intermediate 688) measured 0.79x / 0.76x of onnxruntime at 64 / 16 tokens on a 16-thread "
                       "Xeon (the single 256 x 256 LoRA linear 1.09x; "
                       "benchmarks/results/cpu-avx512-16t-2026-11-25/bench-cpu.json): the kernel's two oneDNN calls "
                       "per tile cost more than they save on narrow GEMMs split 16 ways",
    },
}


# Without oneDNN the CPU kernels' GEMMs run on onnxfuse's built-in kernel, which measured slower than MLAS on every
# family, so the GEMM patterns are left to onnxruntime whatever the host.
BUILTIN_GEMM_REASON = ("the kernel library's CPU GEMMs run on its built-in kernel ({why}), which measured 0.47-0.92x "
                       "of onnxruntime on the GEMM cases of a 16-thread AVX-512 Xeon (benchmarks/results/"
                       "cpu-avx512-16t-builtin-gemm-2026-11-25/); with oneDNN (pip install 'onnxfuse[cpu]') the "
                       "host family's table applies")


def cpu_gemm_engine() -> tuple[bool, str]:
    """(oneDNN, why not) for the library a CPU session here would load: ONNXFUSE_LIBRARY's recorded build info,
    else what a build here finds (kernels.toolchain.find_onednn, no build run)."""
    lib = os.environ.get("ONNXFUSE_LIBRARY")
    if lib:
        from .kernels import build_info
        try:
            gemm = build_info(lib).get("cpu_gemm", "")
        except OSError as e:
            return True, f"unreadable {lib}: {e}"  # the session will say so; do not guess a slower table
        return gemm.startswith("onednn "), gemm
    from .kernels import toolchain
    try:
        found, why = toolchain.find_onednn()
    except toolchain.BuildError as e:
        return False, str(e)
    return found is not None, why


def cpu_left_to_ort(family: str | None = None, threads: int | None = None,
                    onednn: bool | None = None) -> dict[str, str]:
    """The patterns fuse(provider="cpu") leaves to onnxruntime on a host of `family` (default this host's: the CPU
    kernels' family, host.kernel_family()) of `threads` (default this one's), for a library with or without oneDNN
    (default: cpu_gemm_engine()), each with its reason, which names the family."""
    from . import host
    family = family or host.kernel_family()
    if family not in CPU_LEFT_TO_ORT:
        raise OnnxfuseError(f"--cpu-isa must be one of {', '.join(CPU_LEFT_TO_ORT)} (got {family!r})")
    why_not = ""
    if onednn is None:
        onednn, why_not = cpu_gemm_engine()
    if not onednn:
        why = BUILTIN_GEMM_REASON.format(why=why_not or "no oneDNN")
        left = {p: f"on {family} hosts, {why}" for p in _CPU_GEMM_PATTERNS}
    else:
        threads = threads or os.cpu_count() or 1
        most = CPU_TABLE_MAX_THREADS.get(family, threads)
        if threads > most:
            left = {p: f"on {family} hosts of more than {most} threads, {why}"
                    for p, why in CPU_LEFT_TO_ORT_MANY_THREADS.get(family, {}).items()}
        else:
            left = {p: f"on {family} hosts, {why}" for p, why in CPU_LEFT_TO_ORT[family].items()}
    return {**left, **{p: f"on every CPU host, {why}" for p, why in CPU_ALWAYS_LEFT_TO_ORT.items()}}
