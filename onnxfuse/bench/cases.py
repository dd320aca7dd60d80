"""The named workloads of `onnxfuse bench` (CASES) and model files as workloads.

A case at one size and dtype is a Workload: how to build its PyTorch module and inputs, how it is exported
(onnxfuse.export for the Llama and DLRM recipes, a plain torch export otherwise), its cache key and, for the
gated-MLP and LoRA cases, its bare GEMMs (the torch-gemms variant). A model file is a workload too (file_workload):
its onnxfuse recipe gives the module and inputs, else random inputs and no module.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Callable

from ..errors import OnnxfuseError


@dataclasses.dataclass
class Workload:
    """One case at one size: how to build the module and inputs, how to export it, what to call it."""
    case: str
    size: int                      # tokens (Llama, LoRA) or batch (DLRM)
    size_name: str                 # "tokens" | "batch"
    shape: dict
    key: str                       # cache key for the exported / fused models
    build_module: Callable[[], object]
    build_inputs: Callable[[], dict]
    export_kind: str | None = None  # a zoo kind ("llama", "dlrm", "dlrm-upstream", ...): onnxfuse.export.export
    export_spec: object = None
    gemms: Callable | None = None   # (module, inputs on device) -> callable doing the bare GEMMs
    quick: bool = False
    output_names: tuple[str, ...] = ("y",)
    export_options: dict = dataclasses.field(default_factory=dict)  # more keywords of onnxfuse.export.export
    patterns: tuple[str, ...] | None = None  # fuse's --patterns for the fused model (None: fuse's default)


@dataclasses.dataclass(frozen=True)
class CaseDef:
    name: str
    description: str
    size_name: str
    sizes: tuple[int, ...]         # the sizes (GPU default)
    quick_sizes: tuple[int, ...]   # CPU / --quick sizes
    make: Callable                 # (size, dtype, seed, quick, layers) -> Workload


# What makes the exported, ORT-optimized and fused models: a change to any of these files gives new cache keys, so
# a bench never times a model that an older export or older rules wrote (the package version alone did not move).
PIPELINE_SOURCES = ("*.py", "rewrites/*.py")
_PIPELINE_SKIP = ("info.py", "argtypes.py", "_term.py", "doctor.py", "tune.py")


def pipeline_fingerprint(root: pathlib.Path | None = None) -> str:
    """sha1 (12 hex digits) over the sources of export, stage 1 and the rules (PIPELINE_SOURCES under `root`, the
    package by default): the part of every bench cache key that changes when the code that writes the models does."""
    root = pathlib.Path(root) if root is not None else pathlib.Path(__file__).resolve().parent.parent
    if root in _FINGERPRINTS:
        return _FINGERPRINTS[root]
    h = hashlib.sha1()
    for pattern in PIPELINE_SOURCES:
        for path in sorted(root.glob(pattern)):
            if path.name in _PIPELINE_SKIP:
                continue
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    _FINGERPRINTS[root] = h.hexdigest()[:12]
    return _FINGERPRINTS[root]


_FINGERPRINTS: dict[pathlib.Path, str] = {}


def _key(case: str, size: int, dtype: str, seed: int, params: dict) -> str:
    from .. import __version__
    blob = json.dumps({"params": params, "onnxfuse": __version__, "pipeline": pipeline_fingerprint()},
                      sort_keys=True, default=str)
    return f"{case}-{size}-{dtype}-s{seed}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"


def _llama_mlp(case: str, hidden: int, inter: int, q_hidden: int, q_inter: int, lora_rank: int = 0):
    """One LlamaMLP; with lora_rank, peft adapters of that rank on gate, up and down (issue 30's LoRA MLP)."""
    def make(size, dtype, seed, quick, layers):
        from .. import zoo
        h, i = (q_hidden, q_inter) if quick else (hidden, inter)
        spec = zoo.LlamaSpec(hidden_size=h, intermediate_size=i, mlp_only=True, batch=1, seq=size,
                             max_position_embeddings=max(2048, size), lora_rank=lora_rank)
        params = dataclasses.asdict(spec)

        def gemms(module, inputs):
            """gate, up and down GEMMs through torch.matmul, no activation (down takes the gate product)."""
            import torch
            x = inputs["x"].reshape(-1, h)
            wg, wu, wd = (getattr(m, "base_layer", m).weight.t()  # the base weights under peft's adapters
                          for m in (module.gate_proj, module.up_proj, module.down_proj))

            def f():
                g = torch.matmul(x, wg)
                torch.matmul(x, wu)
                return torch.matmul(g, wd)
            return f

        return Workload(case, size, "tokens", {"tokens": size, "hidden": h, "intermediate": i},
                        _key(case, size, dtype, seed, params),
                        lambda: zoo.build_llama(spec, seed, dtype), lambda: zoo.llama_inputs(spec, seed, dtype),
                        "llama", spec, gemms, quick)
    return make


MULTI_ADAPTERS = 8


def _make_multi_lora(size, dtype, seed, quick, layers):
    """`size` decode rows of a LlamaMLP h4096/i11008 whose gate/up/down carry a stack of 8 rank-16 adapters, row i
    using adapter i mod 8 (`export --adapters 8`: MultiLoRALinear per projection). Its torch module gathers each
    row's adapter and runs batched products: what a PyTorch server without punica's kernels does."""
    import torch

    from .. import adapters, zoo
    h, i = (256, 688) if quick else (4096, 11008)
    n, r = MULTI_ADAPTERS, 16
    spec = zoo.LlamaSpec(hidden_size=h, intermediate_size=i, mlp_only=True, batch=size, seq=1,
                         max_position_embeddings=2048, lora_rank=r)
    projections = (("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h))

    def inputs():
        out = dict(zoo.llama_inputs(spec, seed, dtype))
        g = torch.Generator().manual_seed(seed + 1)
        t = zoo.DTYPES[dtype]
        for proj, k, nn_ in projections:
            out[f"{proj}.lora_A"] = (torch.randn(n, k, r, generator=g) / k ** 0.5).to(t)
            out[f"{proj}.lora_B"] = (torch.randn(n, r, nn_, generator=g) / r ** 0.5 * 0.1).to(t)
            out[f"{proj}.lora_scales"] = torch.full((n,), 2.0).to(t)
        out[adapters.ADAPTER_INDEX] = torch.arange(size, dtype=torch.int64) % n
        return out

    def build():
        return _mixed_lora_mlp(zoo.build_llama(spec, seed, dtype))

    params = {**dataclasses.asdict(spec), "adapters": n}
    return Workload("multi-lora-mlp", size, "rows", {"rows": size, "hidden": h, "intermediate": i, "rank": r,
                                                     "adapters": n},
                    _key("multi-lora-mlp", size, dtype, seed, params), build, inputs, "llama", spec, None, quick,
                    export_options={"lora_as_inputs": True, "multi_adapters": n})


def _mixed_lora_mlp(mlp):
    import torch

    class MixedLoRAMLP(torch.nn.Module):
        """A peft LlamaMLP's base layers with a stack of adapters per projection, each batch row its own (the
        inputs of `export --adapters N`, in their order)."""

        def __init__(self, mlp):
            super().__init__()
            self.mlp = mlp

        def forward(self, x, ga, gb, gs, ua, ub, us, da, db, ds, index):
            pick, use = index.clamp(min=0), (index >= 0)[:, None, None]

            def proj(m, v, a, b, s):
                delta = (v @ a[pick]) @ b[pick] * s[pick][:, None, None]
                return m.base_layer(v) + torch.where(use, delta, torch.zeros((), dtype=delta.dtype))

            g = proj(self.mlp.gate_proj, x, ga, gb, gs)
            u = proj(self.mlp.up_proj, x, ua, ub, us)
            return proj(self.mlp.down_proj, torch.nn.functional.silu(g) * u, da, db, ds)
    return MixedLoRAMLP(mlp).eval()


def _gated_mlp(case: str, mlp: str, act: str, hidden: int, inter: int, q_hidden: int, q_inter: int):
    """One transformers gated MLP (`mlp`: "gemma" for GemmaMLP's separate gate/up projections, "phi3" for Phi3MLP's
    merged gate_up_proj + chunk) with gate activation `act`, at the Llama MLP's shapes; weights N(0, 0.02) as the
    llama-mlp case."""
    def make(size, dtype, seed, quick, layers):
        import torch

        from .. import zoo
        h, i = (q_hidden, q_inter) if quick else (hidden, inter)
        params = {"mlp": mlp, "act": act, "hidden": h, "intermediate": i}

        def build():
            import transformers
            if mlp == "phi3":
                from transformers.models.phi3.modeling_phi3 import Phi3MLP as cls
                cfg = transformers.Phi3Config(hidden_size=h, intermediate_size=i, hidden_act=act)
            else:
                from transformers.models.gemma.modeling_gemma import GemmaMLP as cls
                cfg = transformers.GemmaConfig(hidden_size=h, intermediate_size=i, hidden_act=act)
            with zoo.default_dtype(zoo.DTYPES[dtype]):  # parameters made in dtype, as the llama cases do
                torch.manual_seed(seed)
                module = cls(cfg)
                for lin in module.children():
                    if isinstance(lin, torch.nn.Linear):
                        torch.nn.init.normal_(lin.weight, std=0.02)
            return module.to(zoo.DTYPES[dtype]).eval()

        def inputs():
            g = torch.Generator().manual_seed(seed)
            return {"x": torch.randn(1, size, h, generator=g).to(zoo.DTYPES[dtype])}

        def gemms(module, inputs):
            """The projections and the down GEMM through torch.matmul, no activation (same FLOPs as the MLP)."""
            x = inputs["x"].reshape(-1, h)
            wd = module.down_proj.weight.t()
            if mlp == "phi3":
                wgu = module.gate_up_proj.weight.t()
                return lambda: torch.matmul(torch.matmul(x, wgu)[:, :i], wd)
            wg, wu = module.gate_proj.weight.t(), module.up_proj.weight.t()

            def f():
                g = torch.matmul(x, wg)
                torch.matmul(x, wu)
                return torch.matmul(g, wd)
            return f

        return Workload(case, size, "tokens", {"tokens": size, "hidden": h, "intermediate": i, "act": act},
                        _key(case, size, dtype, seed, params), build, inputs, gemms=gemms, quick=quick)
    return make


def _lora_module(k: int, n: int, rank: int):
    import torch
    from torch import nn

    from .. import zoo

    class LoRALinearRelu(nn.Module):
        """nn.Linear wrapped in onnxfuse.zoo.LoRALinear, then ReLU: fuses to onnxfuse::LoRALinearRelu."""

        def __init__(self):
            super().__init__()
            self.lora = zoo.LoRALinear(nn.Linear(k, n), rank, 2.0 * rank)

        def forward(self, x):
            return torch.relu(self.lora(x))

    return LoRALinearRelu()


def _make_lora(size, dtype, seed, quick, layers):
    import torch

    from .. import zoo
    k = n = 256 if quick else 4096
    rank = 16
    params = {"k": k, "n": n, "rank": rank}

    def build():
        torch.manual_seed(seed)
        return _lora_module(k, n, rank).to(zoo.DTYPES[dtype]).eval()

    def inputs():
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(size, k, generator=g).to(zoo.DTYPES[dtype])}

    def gemms(module, inputs):
        """The base GEMM alone (x @ Wᵀ through torch.matmul): what the LoRA branch's cost is measured against."""
        import torch
        x, w = inputs["x"], module.lora.base.weight.t()
        return lambda: torch.matmul(x, w)

    return Workload("lora-linear", size, "tokens", {"tokens": size, "in": k, "out": n, "rank": rank},
                    _key("lora-linear", size, dtype, seed, params), build, inputs, gemms=gemms, quick=quick)


def _make_decode_linear(size, dtype, seed, quick, layers):
    """A decode step's down_proj: nn.Linear(11008, 4096) without a bias on [1, size, 11008] (the exporters' MatMul by
    a constant weight: Linear's rule)."""
    import torch

    from .. import zoo
    k, n = (688, 256) if quick else (11008, 4096)

    def build():
        with zoo.default_dtype(zoo.DTYPES[dtype]):
            torch.manual_seed(seed)
            module = torch.nn.Linear(k, n, bias=False)
            torch.nn.init.normal_(module.weight, std=0.02)
        return module.to(zoo.DTYPES[dtype]).eval()

    def inputs():
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(1, size, k, generator=g).to(zoo.DTYPES[dtype])}

    def gemms(module, inputs):
        x, w = inputs["x"].reshape(-1, k), module.weight.t()
        return lambda: torch.matmul(x, w)

    return Workload("decode-linear", size, "tokens", {"tokens": size, "in": k, "out": n},
                    _key("decode-linear", size, dtype, seed, {"k": k, "n": n}), build, inputs, gemms=gemms,
                    quick=quick)


def _make_decode_skip_norm(size, dtype, seed, quick, layers):
    """A decode step's down_proj, the residual add and the next layer's RMS norm (transformers' LlamaRMSNorm):
    onnxruntime's fusions make the add and the norm SkipSimplifiedLayerNormalization, LinearSkipRMSNorm's opt-in rule
    (--patterns linear_skip_norm,linear) takes it with the MatMul. Returns (the normed rows, the new residual)."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from .. import zoo
    k, n = (688, 256) if quick else (11008, 4096)

    class DownSkipNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.down_proj = torch.nn.Linear(k, n, bias=False)
            self.norm = LlamaRMSNorm(n, eps=1e-5)

        def forward(self, x, residual):
            h = residual + self.down_proj(x)
            return self.norm(h), h

    def build():
        with zoo.default_dtype(zoo.DTYPES[dtype]):
            torch.manual_seed(seed)
            module = DownSkipNorm()
            torch.nn.init.normal_(module.down_proj.weight, std=0.02)
            torch.nn.init.normal_(module.norm.weight, mean=1.0, std=0.1)
        return module.to(zoo.DTYPES[dtype]).eval()

    def inputs():
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(1, size, k, generator=g).to(zoo.DTYPES[dtype]),
                "residual": torch.randn(1, size, n, generator=g).to(zoo.DTYPES[dtype])}

    def gemms(module, inputs):
        x, w = inputs["x"].reshape(-1, k), module.down_proj.weight.t()
        return lambda: torch.matmul(x, w)

    return Workload("decode-skip-norm", size, "tokens", {"tokens": size, "in": k, "out": n},
                    _key("decode-skip-norm", size, dtype, seed, {"k": k, "n": n}), build, inputs, gemms=gemms,
                    quick=quick, output_names=("y", "sum"), patterns=("linear_skip_norm", "linear"))


def _make_mlp_stack(case: str, sizes: list[int], final: str):
    def make(size, dtype, seed, quick, layers):
        import torch

        from .. import zoo
        params = {"sizes": sizes, "final": final}

        def build():
            torch.manual_seed(seed)
            return zoo.mlp(list(sizes), final).to(zoo.DTYPES[dtype]).eval()

        def inputs():
            g = torch.Generator().manual_seed(seed)
            return {"x": torch.randn(size, sizes[0], generator=g).to(zoo.DTYPES[dtype])}

        return Workload(case, size, "batch", {"batch": size, "layers": "-".join(map(str, sizes)) + f"+{final}"},
                        _key(case, size, dtype, seed, params), build, inputs, quick=quick)
    return make


def _dlrm_top_in() -> int:
    from .. import zoo
    spec = zoo.DlrmSpec()
    n_vec = len(spec.cardinalities) + 1
    return spec.embedding_dim + n_vec * (n_vec - 1) // 2  # 16 + 351 = 367: the top MLP's input in DLRM


def _make_dlrm(size, dtype, seed, quick, layers):
    from .. import zoo
    spec = zoo.DlrmSpec.from_preset("small" if quick else "criteo-kaggle", batch=size)
    params = zoo.spec_to_dict(spec)
    return Workload("dlrm", size, "batch", {"batch": size, "bottom": "13-" + "-".join(map(str, spec.bottom_mlp)),
                                            "top": "-".join(map(str, spec.top_mlp)), "table_cap": spec.table_cap},
                    _key("dlrm", size, dtype, seed, params), lambda: zoo.build_dlrm(spec, seed, dtype),
                    lambda: zoo.criteo_batch(spec, size, seed, dtype), "dlrm", spec, None, quick, ("probability",))


def _make_dlrm_upstream(kind: str):
    """facebookresearch/dlrm's DLRM_Net (zoo's `kind`: dlrm-upstream with stacked offsets/indices, or
    dlrm-upstream-tables called with per-table lists, each table with its own bag lengths) at the dlrm case's shapes,
    exported by onnxfuse.export as the repository's --save-onnx does (TorchScript at opset 11, EmbeddingBag Loops):
    fuse upgrades and fuses it (the per-table indices concatenated in the graph for the one op)."""
    layout = kind.removeprefix("dlrm-")

    def make(size, dtype, seed, quick, layers):
        from .. import upstream_dlrm, zoo
        spec = zoo.DlrmSpec.from_preset("small" if quick else "criteo-kaggle", batch=size)
        bags = upstream_dlrm.BAGS
        params = {"dlrm": zoo.spec_to_dict(spec), "layout": layout, "bags": bags, "opset": 11}
        return Workload(kind, size, "batch",
                        {"batch": size, "features": len(spec.table_sizes),
                         "bags": "-".join(map(str, bags)) + (" (+f in bag 0)" if layout == "upstream-tables" else ""),
                         "table_cap": spec.table_cap, "opset": 11},
                        _key(kind, size, dtype, seed, params), lambda: zoo.build_module(kind, spec, seed, dtype),
                        lambda: zoo.make_inputs(kind, spec, seed, dtype, size), kind, spec, quick=quick,
                        output_names=("pred",))
    return make


def _make_dlrm_interaction(size, dtype, seed, quick, layers):
    """The whole DLRM's hash, 26 lookups and dot interaction alone (bottom MLP output and ids in, 367 columns out)."""
    import torch

    from .. import zoo
    spec = zoo.DlrmSpec.from_preset("small" if quick else "criteo-kaggle", batch=size)
    params = {"dlrm": zoo.spec_to_dict(spec), "part": "interaction"}

    def inputs():
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(size, spec.embedding_dim, generator=g).to(zoo.DTYPES[dtype]),
                "sparse": zoo.criteo_batch(spec, size, seed, dtype)["sparse"]}

    return Workload("dlrm-interaction", size, "batch",
                    {"batch": size, "features": len(spec.cardinalities), "dim": spec.embedding_dim,
                     "interaction": spec.interaction, "table_cap": spec.table_cap},
                    _key("dlrm-interaction", size, dtype, seed, params),
                    lambda: zoo.DlrmInteraction(zoo.build_dlrm(spec, seed, dtype)).eval(), inputs, quick=quick)


def _make_llama(size, dtype, seed, quick, layers):
    from .. import zoo
    if size % 2:
        raise OnnxfuseError(f"the llama case runs 2 sequences: --sizes must be even (got {size})")
    seq = size // 2
    spec = zoo.LlamaSpec.from_preset("tiny" if quick else "seed", num_hidden_layers=layers, batch=2, seq=seq)
    spec.max_position_embeddings = max(spec.max_position_embeddings, seq)
    params = zoo.spec_to_dict(spec)
    return Workload("llama", size, "tokens", {"tokens": size, "batch": 2, "seq": seq, "hidden": spec.hidden_size,
                                              "intermediate": spec.intermediate_size, "layers": layers},
                    _key("llama", size, dtype, seed, params), lambda: zoo.build_llama(spec, seed, dtype),
                    lambda: zoo.llama_inputs(spec, seed, dtype), "llama", spec, None, quick, ("last_hidden_state",))


def _make_rotary(size, dtype, seed, quick, layers):
    """HF's apply_rotary_pos_emb on one tensor as a Llama-2-7B layer feeds it: q [1, S, 32, 128] transposed to
    [1, 32, S, 128], rotated with cos/sin [1, 1, S, 128], transposed back."""
    import torch
    from torch import nn

    from .. import zoo
    heads, head_dim = (4, 64) if quick else (32, 128)
    params = {"heads": heads, "head_dim": head_dim}

    class Rotary(nn.Module):
        def forward(self, q, cos, sin):
            t = q.transpose(1, 2)
            half = t.shape[-1] // 2
            rot = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
            return (t * cos.unsqueeze(1) + rot * sin.unsqueeze(1)).transpose(1, 2)

    def inputs():
        g = torch.Generator().manual_seed(seed)
        pos = torch.arange(size, dtype=torch.float32)[:, None]
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        ang = torch.cat([pos * inv, pos * inv], dim=-1)[None]
        return {"q": torch.randn(1, size, heads, head_dim, generator=g).to(zoo.DTYPES[dtype]),
                "cos": ang.cos().to(zoo.DTYPES[dtype]), "sin": ang.sin().to(zoo.DTYPES[dtype])}

    return Workload("rotary-embedding", size, "tokens", {"tokens": size, "heads": heads, "head_dim": head_dim},
                    _key("rotary-embedding", size, dtype, seed, params), lambda: Rotary().eval(), inputs, quick=quick)


def _make_llama7b(size, dtype, seed, quick, layers):
    """One decoder layer at Llama-2-7B shapes (h4096, i11008, 32 heads), one sequence of `size` tokens without
    padding (every key valid: the attention bias is the causal mask alone; the notebook's mask, which keeps key 0
    alone, would let FlashAttention skip all but one key tile a query block)."""
    from .. import zoo
    spec = zoo.LlamaSpec.from_preset("tiny" if quick else "llama2-7b", num_hidden_layers=layers, batch=1, seq=size)
    spec.max_position_embeddings = max(spec.max_position_embeddings, size)
    params = zoo.spec_to_dict(spec)
    return Workload("llama-7b", size, "tokens", {"tokens": size, "batch": 1, "seq": size, "hidden": spec.hidden_size,
                                                 "intermediate": spec.intermediate_size,
                                                 "heads": spec.num_attention_heads, "layers": layers},
                    _key("llama-7b", size, dtype, seed, params), lambda: zoo.build_llama(spec, seed, dtype),
                    lambda: zoo.llama_inputs(spec, seed, dtype, padding=False), "llama", spec, None, quick,
                    ("last_hidden_state",))


CASES: dict[str, CaseDef] = {c.name: c for c in (
    CaseDef("llama-mlp", "one LlamaMLP h4096/i11008 (SwiGLU + down GEMM)", "tokens", (2048, 16), (64, 16),
            _llama_mlp("llama-mlp", 4096, 11008, 256, 688)),
    CaseDef("seed-mlp", "one LlamaMLP h1024/i11008 (the notebook's sizes)", "tokens", (2048,), (64,),
            _llama_mlp("seed-mlp", 1024, 11008, 128, 688)),
    CaseDef("geglu-mlp", "one GemmaMLP h4096/i11008 (GeGLU: gelu_tanh gate; SwiGLU op + down GEMM)", "tokens",
            (2048, 16), (64, 16), _gated_mlp("geglu-mlp", "gemma", "gelu_pytorch_tanh", 4096, 11008, 256, 688)),
    CaseDef("phi3-mlp", "one Phi3MLP h4096/i11008 (merged gate_up_proj + chunk; SwiGLU op + down GEMM)", "tokens",
            (2048, 16), (64, 16), _gated_mlp("phi3-mlp", "phi3", "silu", 4096, 11008, 256, 688)),
    CaseDef("lora-linear", "4096x4096 linear + rank-16 LoRA + ReLU", "tokens", (2048,), (64,), _make_lora),
    CaseDef("decode-linear", "a decode step's down_proj, 11008x4096 without a bias (Linear: the GEMV at one row)",
            "tokens", (1, 8), (1,), _make_decode_linear),
    CaseDef("decode-skip-norm", "a decode step's down_proj 11008x4096, the residual add and the next RMS norm "
            "(fused with --patterns linear_skip_norm,linear: LinearSkipRMSNorm)", "tokens", (1, 8), (1,),
            _make_decode_skip_norm),
    CaseDef("lora-mlp", "one LlamaMLP h4096/i11008 with rank-16 peft adapters on gate/up/down (against llama-mlp's "
            "fused base MLP in the same run)", "tokens", (2048, 16), (64, 16),
            _llama_mlp("lora-mlp", 4096, 11008, 256, 688, lora_rank=16)),
    CaseDef("multi-lora-mlp", f"decode rows of one LlamaMLP h4096/i11008 with {MULTI_ADAPTERS} rank-16 adapters on "
            "gate/up/down, each row its own (export --adapters: MultiLoRALinear; against llama-mlp's fused base MLP "
            "at as many tokens in the same run)", "rows", (8,), (8,), _make_multi_lora),
    CaseDef("dlrm-bottom", "DLRM bottom MLP 13-512-256-64-16, Linear+ReLU", "batch", (128, 2048), (64,),
            _make_mlp_stack("dlrm-bottom", [13, 512, 256, 64, 16], "relu")),
    CaseDef("dlrm-top", "DLRM top MLP 367-512-256-1 + sigmoid", "batch", (128, 2048), (64,),
            lambda *a: _make_mlp_stack("dlrm-top", [_dlrm_top_in(), 512, 256, 1], "sigmoid")(*a)),
    CaseDef("dlrm", "whole DLRM (Criteo-Kaggle tables capped at 262144)", "batch", (128, 2048), (16, 64), _make_dlrm),
    CaseDef("dlrm-upstream", "facebookresearch/dlrm's DLRM_Net as its --save-onnx writes it (opset 11, EmbeddingBag "
            "Loops, bags of 0-3 ids), Criteo-Kaggle tables capped at 262144", "batch", (128, 2048), (16, 64),
            _make_dlrm_upstream("dlrm-upstream")),
    CaseDef("dlrm-upstream-tables", "DLRM_Net called with per-table lists (each table's indices of their own "
            "length), exported as its --save-onnx does (opset 11, one offsets_i / indices_i pair per table)", "batch",
            (128, 2048), (16, 64), _make_dlrm_upstream("dlrm-upstream-tables")),
    CaseDef("dlrm-interaction", "DLRM's hash, 26 embedding lookups and dot interaction alone", "batch", (128, 2048),
            (64,), _make_dlrm_interaction),
    CaseDef("llama", "Llama decoder (seed preset h1024, --layers), 2 sequences", "tokens", (2048,), (64,), _make_llama),
    CaseDef("llama-7b", "Llama decoder at Llama-2-7B shapes (h4096/i11008, 32 heads, --layers), 1 sequence",
            "tokens", (2048,), (64,), _make_llama7b),
    CaseDef("rotary-embedding", "rotary embedding of one q tensor of a Llama-2-7B layer (32 heads x 128), HF's "
            "transposes and rotate_half", "tokens", (2048,), (64,), _make_rotary),
)}


def workloads(names: list[str], dtype: str, seed: int, quick: bool, sizes: list[int] | None,
              layers: int) -> list[Workload]:
    out = []
    for name in names:
        if name not in CASES:
            raise OnnxfuseError(f"unknown case {name!r}; choose from {', '.join(CASES)}, 'all', or give an .onnx path")
        c = CASES[name]
        for size in (sizes or (c.quick_sizes if quick else c.sizes)):
            out.append(c.make(size, dtype, seed, quick, layers))
    return out


def file_workload(path: str, seed: int = 0) -> Workload:
    """A model file: the module and inputs come from its recipe when it has one; else random inputs (seeded), no
    torch module."""
    from .. import export, onnxio, zoo
    p = pathlib.Path(path)
    model = onnxio.load(p, load_external_data=False)
    recipe = export.read_recipe(model)
    if recipe:
        spec = zoo.spec_from_dict(recipe["kind"], recipe["spec"])
        build = lambda: zoo.build_module(recipe["kind"], spec, recipe["seed"], recipe["dtype"])  # noqa: E731
        inputs = lambda: zoo.make_inputs(recipe["kind"], spec, recipe["seed"], recipe["dtype"])  # noqa: E731
    else:
        build = None

        def inputs():
            import torch

            from .. import runtime
            sess = runtime.session(p, "cpu", library=False) if not runtime.has_onnxfuse_nodes(model) else \
                runtime.session(p, "cpu")
            return {k: torch.from_numpy(v) for k, v in runtime.random_feeds(sess, seed).items()}
    size = 0
    for i in model.graph.input:  # the first dim of the first input (batch or rows)
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if dims:
            size = dims[0]
            break
    return Workload(p.stem, size, "rows", {"model": str(p)}, "file", build, inputs, quick=False,
                    output_names=tuple(o.name for o in model.graph.output))
