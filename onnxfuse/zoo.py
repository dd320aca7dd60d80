"""The PyTorch modules onnxfuse exports: transformers Llama decoders and MLPs (optionally with peft LoRA), and DLRM
(with an optional plain-PyTorch LoRA on its MLPs). Everything is random-initialised from a seed, so a recipe
(kind, config, seed, dtype) rebuilds the same weights bit for bit; nothing is downloaded.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, fields, replace

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# ---------------------------------------------------------------------------------------------------------- Llama

# The small Llama of the Llama-MLP notebook onnxfuse grew from (hidden 1024, intermediate 11008, 4 heads).
LLAMA_PRESETS: dict[str, dict] = {
    "seed": dict(hidden_size=1024, intermediate_size=11008, num_attention_heads=4, num_key_value_heads=4,
                 vocab_size=32000, max_position_embeddings=2048, batch=2, seq=1024),
    "tiny": dict(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=4,
                 vocab_size=256, max_position_embeddings=128, batch=2, seq=16),
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32,
                      vocab_size=32000, max_position_embeddings=4096, batch=1, seq=128),
}


@dataclass
class LlamaSpec:
    hidden_size: int = 1024
    intermediate_size: int = 11008
    num_hidden_layers: int = 1
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    vocab_size: int = 32000
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    hidden_act: str = "silu"
    mlp_bias: bool = False
    attention_bias: bool = False
    attn_implementation: str = "eager"
    mlp_only: bool = False
    batch: int = 2
    seq: int = 1024
    lora_rank: int = 0
    lora_alpha: float = 0.0  # 0 means 2 * rank
    lora_targets: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")

    @classmethod
    def from_preset(cls, preset: str = "seed", **overrides) -> "LlamaSpec":
        if preset not in LLAMA_PRESETS:
            raise KeyError(preset)
        values = dict(LLAMA_PRESETS[preset])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def validate(self) -> None:
        from .errors import OnnxfuseError
        for f in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                  "max_position_embeddings", "batch", "seq", "num_key_value_heads"):
            if getattr(self, f) <= 0:
                raise OnnxfuseError(f"--{f.replace('_', '-')} must be positive (got {getattr(self, f)})")
        if self.hidden_size % self.num_attention_heads:
            raise OnnxfuseError(f"--hidden-size {self.hidden_size} is not divisible by --num-attention-heads "
                                f"{self.num_attention_heads}; choose sizes where it is")
        if self.num_attention_heads % self.num_key_value_heads:
            raise OnnxfuseError("--num-attention-heads must be a multiple of --num-key-value-heads")
        if self.seq > self.max_position_embeddings:
            raise OnnxfuseError(f"--seq {self.seq} exceeds --max-position-embeddings {self.max_position_embeddings}")
        if self.lora_rank < 0:
            raise OnnxfuseError("--lora-rank must be >= 0")
        allowed = {"gate_proj", "up_proj", "down_proj", "q_proj", "k_proj", "v_proj", "o_proj"}
        bad = [t for t in self.lora_targets if t not in allowed]
        if bad:
            raise OnnxfuseError(f"--lora-targets: unknown module(s) {', '.join(bad)}; "
                                f"choose from {', '.join(sorted(allowed))}")

    def config(self):
        from transformers import LlamaConfig
        cfg = LlamaConfig(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, hidden_act=self.hidden_act, mlp_bias=self.mlp_bias,
            attention_bias=self.attention_bias, use_cache=False)
        cfg._attn_implementation = self.attn_implementation
        return cfg


class LlamaDecoder(nn.Module):
    """`LlamaModel` returning only the last hidden state (a plain tensor: what the ONNX graph outputs)."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaModel
        self.model = LlamaModel(config)

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype set to `dtype` inside the block (parameters are created in it), restored after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_llama(spec: LlamaSpec, seed: int, dtype: str) -> nn.Module:
    """Parameters are created (and randomly initialised) directly in `dtype`: an fp32 build cast afterwards would
    need 4 bytes per parameter, 26 GB for Llama-2-7B, more than a 24 GiB machine has."""
    with default_dtype(DTYPES[dtype]):
        return _build_llama(spec, seed, dtype)


def _build_llama(spec: LlamaSpec, seed: int, dtype: str) -> nn.Module:
    cfg = spec.config()
    torch.manual_seed(seed)
    if spec.mlp_only:
        from transformers.models.llama.modeling_llama import LlamaMLP
        module = LlamaMLP(cfg)
        # LlamaMLP's Linear layers keep PyTorch's default init; match the decoder's std so scales are comparable.
        for lin in (module.gate_proj, module.up_proj, module.down_proj):
            nn.init.normal_(lin.weight, std=cfg.initializer_range)
    else:
        module = LlamaDecoder(cfg)
    if spec.lora_rank:
        module = _apply_peft_lora(module, spec, seed)
    return module.to(DTYPES[dtype]).eval()


def _apply_peft_lora(module: nn.Module, spec: LlamaSpec, seed: int) -> nn.Module:
    from peft import LoraConfig, inject_adapter_in_model
    torch.manual_seed(seed + 1)
    cfg = LoraConfig(r=spec.lora_rank, lora_alpha=spec.lora_alpha or 2 * spec.lora_rank,
                     target_modules=list(spec.lora_targets), lora_dropout=0.0,
                     # Random A *and* B: with peft's default (B = 0) the branch would be a no-op and prove nothing.
                     init_lora_weights=False)
    return inject_adapter_in_model(cfg, module)


def llama_inputs(spec: LlamaSpec, seed: int, dtype: str, padding: bool = True) -> dict[str, torch.Tensor]:
    """Random ids and the attention mask: the notebook's (padding=True: tril(ones(batch, seq)), which for batch 1
    keeps key 0 alone), or every key valid (a prompt without padding)."""
    g = torch.Generator().manual_seed(seed)
    if spec.mlp_only:
        x = torch.randn(spec.batch, spec.seq, spec.hidden_size, generator=g)
        return {"x": x.to(DTYPES[dtype])}
    ids = torch.randint(0, spec.vocab_size, (spec.batch, spec.seq), generator=g, dtype=torch.int64)
    # The notebook's float mask: tril(ones(batch, seq)); HF combines it with the causal mask.
    mask = torch.ones(spec.batch, spec.seq, dtype=torch.float32)
    if padding:
        mask = torch.tril(mask)
    return {"input_ids": ids, "attention_mask": mask}


# ----------------------------------------------------------------------------------------------------------- DLRM

# Criteo Kaggle (Display Advertising Challenge) cardinalities of the 26 categorical features.
CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306, 10, 5652,
    2173, 4, 7046547, 18, 15, 286181, 105, 142572)
DLRM_PRESETS: dict[str, dict] = {
    # Criteo-Kaggle-like, tables capped so the model (~120 MB fp32) fits this machine's export/verify budget.
    "criteo-kaggle": dict(table_cap=262144),
    "small": dict(table_cap=1000, batch=32),
}


@dataclass
class DlrmSpec:
    num_dense: int = 13
    bottom_mlp: tuple[int, ...] = (512, 256, 64, 16)
    top_mlp: tuple[int, ...] = (512, 256, 1)
    embedding_dim: int = 16
    cardinalities: tuple[int, ...] = CRITEO_KAGGLE_CARDINALITIES
    table_cap: int = 262144
    interaction: str = "dot"
    batch: int = 128
    lora_rank: int = 0
    lora_alpha: float = 0.0  # 0 means 2 * rank

    @classmethod
    def from_preset(cls, preset: str = "criteo-kaggle", **overrides) -> "DlrmSpec":
        if preset not in DLRM_PRESETS:
            raise KeyError(preset)
        values = dict(DLRM_PRESETS[preset])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def table_sizes(self) -> tuple[int, ...]:
        return tuple(min(c, self.table_cap) for c in self.cardinalities)

    def validate(self) -> None:
        from .errors import OnnxfuseError
        if self.interaction not in ("dot", "cat"):
            raise OnnxfuseError(f"--interaction must be dot or cat (got {self.interaction!r})")
        if not self.bottom_mlp or not self.top_mlp or min(self.bottom_mlp + self.top_mlp) <= 0:
            raise OnnxfuseError("--bottom-mlp/--top-mlp need positive layer sizes, e.g. 512,256,64,16")
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise OnnxfuseError(f"the bottom MLP must end in the embedding dim ({self.embedding_dim}) so its output "
                                f"interacts with the embeddings; got {'-'.join(map(str, self.bottom_mlp))}")
        if self.batch <= 0 or self.num_dense <= 0 or self.table_cap <= 0 or not self.cardinalities:
            raise OnnxfuseError("--batch, --num-dense, --table-cap and the cardinalities must be positive")
        if self.lora_rank < 0:
            raise OnnxfuseError("--lora-rank must be >= 0")


class LoRALinear(nn.Module):
    """A plain-PyTorch LoRA linear: ``y = x @ Wᵀ + b + s · (x @ Aᵀ) @ Bᵀ`` (as in the DLRM lecture's case study).

    A and B are both random (B non-zero) so the branch changes the output.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.lora_B = nn.Parameter(torch.randn(base.out_features, rank) / math.sqrt(rank))
        self.scaling = alpha / rank

    def forward(self, x):
        return self.base(x) + self.scaling * ((x @ self.lora_A.t()) @ self.lora_B.t())


def mlp(sizes: list[int], final: str = "relu", lora_rank: int = 0, lora_alpha: float = 0.0) -> nn.Sequential:
    """DLRM's MLP: Linear + ReLU per layer of `sizes` (in, hidden..., out), the last activation a Sigmoid when `final`
    is "sigmoid"; with lora_rank, every Linear wrapped in LoRALinear (alpha default 2 * rank)."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        lin: nn.Module = nn.Linear(fan_in, fan_out)
        # DLRM reference init: normal with std sqrt(2/(fan_in+fan_out)) for W and sqrt(1/fan_out) for b.
        nn.init.normal_(lin.weight, 0.0, math.sqrt(2.0 / (fan_in + fan_out)))
        nn.init.normal_(lin.bias, 0.0, math.sqrt(1.0 / fan_out))
        if lora_rank:
            lin = LoRALinear(lin, lora_rank, lora_alpha or 2 * lora_rank)
        layers.append(lin)
        last = i == len(sizes) - 2
        layers.append(nn.Sigmoid() if last and final == "sigmoid" else nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019): bottom MLP on dense features, one embedding table per categorical feature
    (ids hashed into the table with the lecture's modulus hash), pairwise dot-product interaction of the 27 vectors
    (strict lower triangle) concatenated with the dense vector, top MLP ending in a sigmoid."""

    def __init__(self, spec: DlrmSpec):
        super().__init__()
        self.spec = spec
        self.bottom = mlp([spec.num_dense, *spec.bottom_mlp], "relu", spec.lora_rank, spec.lora_alpha)
        self.embeddings = nn.ModuleList()
        for n in spec.table_sizes:
            emb = nn.Embedding(n, spec.embedding_dim)
            nn.init.uniform_(emb.weight, -math.sqrt(1.0 / n), math.sqrt(1.0 / n))
            self.embeddings.append(emb)
        self.register_buffer("cardinality", torch.tensor(spec.table_sizes, dtype=torch.int64), persistent=False)
        n_vec = len(spec.table_sizes) + 1
        if spec.interaction == "dot":
            li, lj = torch.tril_indices(n_vec, n_vec, offset=-1)
            self.register_buffer("tri_i", li, persistent=False)
            self.register_buffer("tri_j", lj, persistent=False)
            top_in = spec.embedding_dim + n_vec * (n_vec - 1) // 2
        else:
            top_in = spec.embedding_dim * n_vec
        self.top = mlp([top_in, *spec.top_mlp], "sigmoid", spec.lora_rank, spec.lora_alpha)

    def forward(self, dense, sparse):
        return self.top(self.interact(self.bottom(dense), sparse))

    def interact(self, x, sparse):
        """The hash, the lookups and the interaction: the top MLP's input from the bottom MLP's output x."""
        idx = modulus_hash(sparse, self.cardinality)
        vectors = [x] + [emb(idx[:, i]) for i, emb in enumerate(self.embeddings)]
        if self.spec.interaction == "dot":
            t = torch.stack(vectors, dim=1)                  # (B, 27, d)
            z = torch.bmm(t, t.transpose(1, 2))              # (B, 27, 27)
            inter = z[:, self.tri_i, self.tri_j]             # (B, 351): strict lower triangle
            r = torch.cat([x, inter], dim=1)
        else:
            r = torch.cat(vectors, dim=1)
        return r


class DlrmInteraction(nn.Module):
    """A DLRM's embedding lookups and feature interaction alone (dense vector and ids in, the top MLP's input out):
    what onnxfuse's EmbeddingInteraction replaces (bench's dlrm-interaction case)."""

    def __init__(self, dlrm: DLRM):
        super().__init__()
        self.dlrm = dlrm

    def forward(self, x, sparse):
        return self.dlrm.interact(x, sparse)


def modulus_hash(ids: torch.Tensor, cardinality: torch.Tensor) -> torch.Tensor:
    """The DLRM lecture's cheap categorical hash: ``(id + 1) % cardinality`` per feature column."""
    return (ids + 1) % cardinality


def build_dlrm(spec: DlrmSpec, seed: int, dtype: str) -> nn.Module:
    torch.manual_seed(seed)
    return DLRM(spec).to(DTYPES[dtype]).eval()


def criteo_batch(spec: DlrmSpec, batch: int, seed: int, dtype: str = "fp32") -> dict[str, torch.Tensor]:
    """A random batch shaped like preprocessed Criteo data: 13 dense count features, log(1 + x)-transformed as in
    the DLRM reference, and 26 raw categorical ids (32-bit hash values) that the model hashes into its tables."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.floor(torch.exp(torch.randn(batch, spec.num_dense, generator=g) * 1.5))
    dense = torch.log1p(counts).to(DTYPES[dtype])
    sparse = torch.randint(0, 2**32, (batch, len(spec.cardinalities)), generator=g, dtype=torch.int64)
    return {"dense": dense, "sparse": sparse}


# ---------------------------------------------------------------------------------------------------------- recipes

def spec_to_dict(spec) -> dict:
    d = asdict(spec)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


# facebookresearch/dlrm's DLRM_Net at a DlrmSpec's shapes (onnxfuse/upstream_dlrm.py): stacked offsets/indices, or
# lists of one tensor per table (ListsCall takes them flattened: dense_x, offsets_0.., indices_0..).
DLRM_UPSTREAM_KINDS = ("dlrm-upstream", "dlrm-upstream-tables")


def spec_from_dict(kind: str, d: dict):
    cls = {"llama": LlamaSpec, "dlrm": DlrmSpec, **{k: DlrmSpec for k in DLRM_UPSTREAM_KINDS}}[kind]
    names = {f.name for f in fields(cls)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
    return cls(**values)


def build_module(kind: str, spec, seed: int, dtype: str) -> nn.Module:
    if kind == "llama":
        return build_llama(spec, seed, dtype)
    if kind == "dlrm":
        return build_dlrm(spec, seed, dtype)
    if kind in DLRM_UPSTREAM_KINDS:
        from . import upstream_dlrm
        module = upstream_dlrm.criteo_module(spec, seed, DTYPES[dtype])
        return upstream_dlrm.ListsCall(module) if kind == "dlrm-upstream-tables" else module
    raise KeyError(kind)


def make_inputs(kind: str, spec, seed: int, dtype: str, batch: int | None = None) -> dict[str, torch.Tensor]:
    if kind == "llama":
        return llama_inputs(spec if batch is None else replace(spec, batch=batch), seed, dtype)
    if kind == "dlrm":
        return criteo_batch(spec, batch or spec.batch, seed, dtype)
    if kind in DLRM_UPSTREAM_KINDS:
        from . import upstream_dlrm
        tables, size = list(spec.table_sizes), batch or spec.batch
        if kind == "dlrm-upstream":
            dense, offsets, indices = upstream_dlrm.make_batch(tables, size, list(upstream_dlrm.BAGS), seed,
                                                               spec.num_dense)
            return {"dense_x": dense.to(DTYPES[dtype]), "offsets": offsets, "indices": indices}
        dense, lS_o, lS_i = upstream_dlrm.make_lists(tables, size, list(upstream_dlrm.BAGS), seed, spec.num_dense)
        return dict(zip(upstream_dlrm.list_input_names(len(tables)), (dense.to(DTYPES[dtype]), *lS_o, *lS_i)))
    raise KeyError(kind)
