"""What `fuse --provider cpu` leaves to onnxruntime, per host family: the CPU kernels' measured losses.

The CPU kernels pick their code at run time by the host's vector ISA (host.FAMILIES), and how they compare with
onnxruntime's own MLAS kernels differs by family: oneDNN's fp32 matmul is a brgemm kernel with AVX-512 and its older
gemm:jit kernel without. CPU_LEFT_TO_ORT lists, per family, the patterns whose fused op measured slower than the
unfused graph there, each with its measurement; CPU_STACKS_ONLY keeps one shape where a family's linear layers still
win: an MLPStack whose first layer is narrow (DLRM's bottom MLP, 13 features), with every other linear_act node put
back as MatMul + Add + activation by `expand_linear_layers`. The bench's fused-cpu variant is what this gives a host;
its fused-cpu-all variant (every pattern fused) is the evidence for the next revision.
"""
from __future__ import annotations

import dataclasses
import os

from onnxscript import ir

from .errors import OnnxfuseError
from .rewrites import _base
from .schema import DOMAIN

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
    "avx2": {  # linear_act and mlp_stack: CPU_STACKS_ONLY
        "swiglu": "without AVX-512, oneDNN 3.2's fp32 matmul is its gemm:jit kernel, not brgemm: the fused Llama MLP "
                  "measured 0.75-0.87x, GeGLU 0.81-0.87x and Phi-3 0.84-0.89x of onnxruntime on a 2-core AMD EPYC "
                  "(benchmarks/results/cpu-avx2-2026-11-25/)",
    },
    "generic": {p: "not measured on a host without AVX2: left to onnxruntime's MLAS" for p in _CPU_GEMM_PATTERNS},
}


@dataclasses.dataclass(frozen=True)
class StacksOnly:
    """On this family linear_act layers stay fused only inside an MLPStack whose first layer has K <= max_k."""
    max_k: int
    reason: str


CPU_STACKS_ONLY: dict[str, StacksOnly] = {
    "avx2": StacksOnly(64, "the DLRM bottom MLP (13-512-256-64-16) as one MLPStack measured 1.78x onnxruntime on "
                           "a 2-core AMD EPYC, the top MLP (367-512-256-1) 0.88x (benchmarks/results/"
                           "cpu-avx2-2026-11-25/): stacks whose first layer reads more than 64 features, and "
                           "single layers, are left to onnxruntime"),
}


# Families whose table holds only on small hosts: the avx512 entries were measured on 2 cores of a Sapphire Rapids;
# on a 16-thread one every GEMM pattern won (SwiGLU 1.16-1.97x, the DLRM MLPs 1.21-1.50x, whole DLRM 2.10-2.20x
# unfused onnxruntime: benchmarks/results/cpu-avx512-16t-2026-11-25/), so past this many threads nothing is left out.
CPU_TABLE_MAX_THREADS: dict[str, int] = {"avx512": 4}


def cpu_left_to_ort(family: str | None = None, threads: int | None = None) -> dict[str, str]:
    """The patterns fuse(provider="cpu") leaves to onnxruntime on a host of `family` (default this host's: the CPU
    kernels' family, host.kernel_family()) of `threads` (default this one's), each with its reason, which names
    the family."""
    from . import host
    family = family or host.kernel_family()
    if family not in CPU_LEFT_TO_ORT:
        raise OnnxfuseError(f"--cpu-isa must be one of {', '.join(CPU_LEFT_TO_ORT)} (got {family!r})")
    threads = threads or os.cpu_count() or 1
    if threads > CPU_TABLE_MAX_THREADS.get(family, threads):
        return {}
    return {p: f"on {family} hosts, {why}" for p, why in CPU_LEFT_TO_ORT[family].items()}


_LAYER_ACTS = {"LinearRelu": ["relu"], "LinearSigmoid": ["sigmoid"]}


def expand_linear_layers(model: ir.Model, recorder: _base.Recorder, family: str) -> int:
    """Put back as MatMul + Add + activation every LinearRelu/LinearSigmoid node, and every MLPStack whose first
    layer has K > max_k, of CPU_STACKS_ONLY[family] (a no-op for other families); drops their matches from the
    recorder. Returns how many fused nodes were expanded."""
    rule = CPU_STACKS_ONLY.get(family)
    if rule is None:
        return 0
    expanded = set()
    for graph in _base.graphs(model.graph):
        for node in list(graph):
            if node.domain != DOMAIN:
                continue
            if node.op_type in _LAYER_ACTS:
                acts = _LAYER_ACTS[node.op_type]
            elif node.op_type == "MLPStack":
                k = (_base.dims(node.inputs[1]) or [None])[0]
                if isinstance(k, int) and k <= rule.max_k:
                    continue
                acts = node.attributes.get_string("activations", "").split(".")
            else:
                continue
            _expand(graph, node, acts)
            expanded.add(node.name)
    recorder.matches[:] = [m for m in recorder.matches if m.node not in expanded]
    return len(expanded)


def _expand(graph: ir.Graph, node: ir.Node, acts: list[str]) -> None:
    """One fused linear node (X, W_1, bias_1, ...) -> per layer MatMul, Add, Relu/Sigmoid, in place."""
    h = node.inputs[0]
    new_nodes = []
    for i, act in enumerate(acts):
        w, b = node.inputs[1 + 2 * i], node.inputs[2 + 2 * i]
        mm = ir.Node("", "MatMul", [h, w], num_outputs=1)
        add = ir.Node("", "Add", [mm.outputs[0], b], num_outputs=1)
        out = ir.Node("", "Relu" if act == "relu" else "Sigmoid", [add.outputs[0]], num_outputs=1)
        for n in (mm, add, out):
            n.outputs[0].dtype = node.outputs[0].dtype
        new_nodes += [mm, add, out]
        h = out.outputs[0]
    old_out = node.outputs[0]
    h.shape = old_out.shape
    ir.convenience.replace_nodes_and_values(graph, node, [node], new_nodes, [old_out], [h])
