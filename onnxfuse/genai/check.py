"""`onnxfuse verify DIR`: a genai folder against the transformers CausalLM it was built from.

  * logits: the prefill (every prompt position) and 16 greedy decode steps through genai's KV cache, each against
    transformers fed the same tokens with its own cache, within verify.TOLERANCES for the folder's dtype
    (max|d| / max|ref|, the reference in fp32 on the same weights);
  * text: 32 greedy tokens (EOS held back until then) from genai's Generator against transformers'
    generate(do_sample=False, min_new_tokens=32): token for token
    in fp32; in fp16/bf16 the first divergence is reported (near-equal logits may round the other way);
  * perplexity (int4 folders, whose weights are not the checkpoint's: issue 28): of the folder's model and of the
    fp32 reference on a fixed text that ships with Python (the Zen of Python, `import this`); an int4 folder passes
    when its perplexity is within QUANTIZED_PPL_RATIO of the reference's and its logits are finite (their errors
    and the first greedy divergence are reported; --tolerance makes the logits a check again).
"""
from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from ..errors import OnnxfuseError
from . import folder as gf
from .source import Source, load_causal_lm, load_tokenizer, resolve

DEFAULT_PROMPT = "The capital of France is"
LOGIT_STEPS = 16
TEXT_TOKENS = 32
# fp32: a whole decoder through genai's attention (GroupQueryAttention, its softcap) and onnxruntime's contrib
# kernels, against transformers' eager one: the builder's own unfused Gemma 2 measured 1.0e-4 of the largest logit;
# the half types take verify.TOLERANCES'.
FOLDER_TOLERANCES = {"fp32": 5e-4}
DTYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "int4": "fp32"}  # int4 runs fp32 activations on the CPU
# An int4 folder's perplexity on PERPLEXITY_TEXT may be at most this much above the fp32 reference's (issue 28).
QUANTIZED_PPL_RATIO = 1.10


@dataclasses.dataclass
class TokenCheck:
    onnx: list[int]
    reference: list[int]
    first_divergence: int | None
    exact_required: bool

    @property
    def passed(self) -> bool:
        return self.first_divergence is None or not self.exact_required


@dataclasses.dataclass
class Perplexity:
    text: str
    tokens: int
    onnx: float
    reference: float
    max_ratio: float

    @property
    def ratio(self) -> float:
        return self.onnx / self.reference

    @property
    def passed(self) -> bool:
        return self.ratio <= self.max_ratio


@dataclasses.dataclass
class FolderVerifyResult:
    folder: str
    provider: str
    dtype: str
    fused_nodes: int
    library: bool
    prompt_ids: list[int]
    outputs: list  # verify.OutputCheck
    tokens: TokenCheck
    quantized: bool = False           # int4 weights: the logits and tokens are reported, the perplexity decides
    perplexity: Perplexity | None = None
    cuda_graph: bool = False          # genai ran the decode steps as captured CUDA graphs

    @property
    def passed(self) -> bool:
        if self.quantized:
            return self.perplexity is not None and self.perplexity.passed and all(o.passed for o in self.outputs)
        return all(o.passed for o in self.outputs) and self.tokens.passed

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["passed"] = self.passed
        d["tokens"]["passed"] = self.tokens.passed
        if self.perplexity is not None:
            d["perplexity"].update(ratio=round(self.perplexity.ratio, 4), passed=self.perplexity.passed)
        return d


def source_of(folder: pathlib.Path, recipe: dict | None, override: str | None, work: pathlib.Path,
              trust_remote_code: bool = False) -> Source:
    """The checkpoint behind `folder`: `override` (--source), else the recipe's."""
    spec = override or (recipe or {}).get("source", {}).get("source")
    if not spec:
        raise OnnxfuseError(f"{folder}: no {gf.RECIPE} names its checkpoint (a folder made by the builder directly); "
                            "pass --source with the transformers folder or .gguf it was built from")
    trust = trust_remote_code or bool((recipe or {}).get("source", {}).get("trust_remote_code"))
    return resolve(spec, work, trust_remote_code=trust, allow_pickle=True, convert=False)


def verify_folder(folder: pathlib.Path, *, source: Source, provider: str | None = None,
                  prompt: str = DEFAULT_PROMPT, prompt_ids: list[int] | None = None,
                  tolerance: float | None = None, cuda_graph: bool = False, reference=None) -> FolderVerifyResult:
    """`reference`: the transformers model of `source`, already loaded (several checks of one folder share it)."""
    import torch

    from ..verify import TOLERANCES, compare
    from .generate import kv_length, load_model, prompt_ids as tokenize
    config = gf.read_config(folder)
    recipe = gf.read_recipe(folder) or {}
    provider = provider or gf.provider_of(config)
    precision = recipe.get("precision") or _precision_of(folder, config)
    dtype = DTYPES.get(precision, "fp32")
    quantized = precision == "int4"
    tol = tolerance if tolerance is not None else FOLDER_TOLERANCES.get(dtype, TOLERANCES[(dtype, provider)])
    if quantized and tolerance is None:
        tol = float("inf")  # int4 weights are not the checkpoint's: the errors are reported (finite required)
    tokenizer = load_tokenizer(folder)
    ids = list(prompt_ids) if prompt_ids is not None else tokenize(tokenizer, prompt, chat=False)
    if not ids:
        raise OnnxfuseError("the prompt has no tokens; give a non-empty --prompt")
    ref_model = reference if reference is not None else load_causal_lm(source)
    device = "cuda" if provider == "cuda" and torch.cuda.is_available() else "cpu"
    ref_model.to(device)  # fp32 on the GPU beside the folder's model: a 7B reference takes 28 GB
    og, model = load_model(folder, provider, cuda_graph)
    vocab = int(config["model"]["vocab_size"])
    outputs = []

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=kv_length(config, len(ids) + LOGIT_STEPS + 1), do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    got = prefill_logits(gen, len(ids), vocab)
    with torch.no_grad():
        out = ref_model(torch.tensor([ids], device=device), use_cache=True)
    ref = out.logits[0].float().cpu().numpy()[:, :vocab]
    if len(got) == len(ids):
        outputs.append(compare(f"prefill logits ({len(ids)} positions)", got, ref, tol))
    else:
        outputs.append(compare(f"prefill logits (the last of {len(ids)} positions: the folder's lm_head is pruned)",
                               got, ref[-1:], tol))
    past = out.past_key_values
    for step in range(1, LOGIT_STEPS + 1):
        if gen.is_done():
            break
        gen.generate_next_token()
        token = int(gen.get_next_tokens()[0])
        got = np.asarray(gen.get_logits(), np.float32).reshape(-1)[:vocab]
        with torch.no_grad():
            out = ref_model(torch.tensor([[token]], device=device), past_key_values=past, use_cache=True)
        past = out.past_key_values
        outputs.append(compare(f"decode step {step} logits", got, out.logits[0, -1].float().cpu().numpy()[:vocab], tol))

    onnx_tokens = greedy_tokens(og, model, ids, TEXT_TOKENS, kv_length(config, len(ids) + TEXT_TOKENS))
    with torch.no_grad():
        seq = ref_model.generate(torch.tensor([ids], device=device),
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                                 max_new_tokens=TEXT_TOKENS, min_new_tokens=TEXT_TOKENS, do_sample=False,
                                 pad_token_id=_pad(ref_model, config))
    ref_tokens = [int(t) for t in seq[0, len(ids):].cpu()]
    first = next((i for i, (a, b) in enumerate(zip(onnx_tokens, ref_tokens)) if a != b), None)
    if first is None and len(onnx_tokens) != len(ref_tokens):
        first = min(len(onnx_tokens), len(ref_tokens))
    tokens = TokenCheck(onnx_tokens, ref_tokens, first, exact_required=dtype == "fp32" and not quantized)
    fused = sum((recipe.get("fused") or {}).values())
    library = bool(config["model"]["decoder"].get("session_options", {}).get("custom_ops_library"))
    ppl = perplexity(og, model, config, tokenizer, ref_model, device) if quantized else None
    return FolderVerifyResult(str(folder), provider, "int4" if quantized else dtype, fused, library, ids, outputs,
                              tokens, quantized, ppl, cuda_graph)


def perplexity_text() -> str:
    """The Zen of Python: a fixed English text every Python ships (the `this` module, stored in rot13)."""
    import codecs
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the text
        import this
    return codecs.decode(this.s, "rot13")


def _mean_nll(logits: np.ndarray, ids: list[int]) -> float:
    """Mean negative log-likelihood of ids[1:] under logits[:-1] ([T, V]), in float64."""
    z = logits[:-1].astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].mean())


def prefill_logits(gen, n: int, vocab: int) -> np.ndarray:
    """The logits after a prefill of n tokens as [rows, vocab]: n rows, or 1 (the last position's) where the folder's
    lm_head is pruned (the builder's prune_lm_head, which genai serves: a prefill needs only the last position)."""
    a = np.asarray(gen.get_output("logits"), np.float32)
    a = a.reshape(-1, a.shape[-1])[:, :vocab]
    if len(a) not in (n, 1):
        raise OnnxfuseError(f"the folder's decoder gave {len(a)} rows of logits for a prefill of {n} tokens; "
                            f"verify takes {n} (every position) or 1 (a pruned lm_head)")
    return a


def perplexity(og, model, config: dict, tokenizer, ref_model, device: str) -> Perplexity:
    """Perplexity of the folder's model (one genai prefill over the text: the logits of every position; with a pruned
    lm_head, one token a step) and of the reference (one forward pass) on perplexity_text(), cut to the model's
    context."""
    import torch

    from .generate import context_length, kv_length
    ids = [int(t) for t in tokenizer(perplexity_text())["input_ids"]][:context_length(config)]  # what fits
    vocab = int(config["model"]["vocab_size"])
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=kv_length(config, len(ids) + 1), do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    got = prefill_logits(gen, len(ids), vocab)
    if len(got) != len(ids):  # a pruned lm_head: each position's logits from a step of its own
        gen = og.Generator(model, params)
        rows = []
        for t in ids:
            gen.append_tokens([t])
            rows.append(prefill_logits(gen, 1, vocab)[-1])
        got = np.stack(rows)
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids], device=device)).logits[0].float().cpu().numpy()[:, :vocab]
    return Perplexity("the Zen of Python (import this)", len(ids), round(float(np.exp(_mean_nll(got, ids))), 4),
                      round(float(np.exp(_mean_nll(ref, ids))), 4), QUANTIZED_PPL_RATIO)


def greedy_tokens(og, model, ids: list[int], n: int, max_length: int) -> list[int]:
    """`n` greedy tokens after `ids`, EOS held back until then (as transformers' generate with min_new_tokens)."""
    params = og.GeneratorParams(model)
    # min_length: EOS is not picked before n tokens (transformers' min_new_tokens), so every check compares n
    params.set_search_options(max_length=max_length, min_length=len(ids) + n, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    new = []
    while not gen.is_done() and len(new) < n:
        gen.generate_next_token()
        new.append(int(gen.get_next_tokens()[0]))
    return new


def _pad(model, config: dict) -> int | None:
    pad = getattr(model.generation_config, "pad_token_id", None)
    return pad if pad is not None else config["model"].get("pad_token_id")


def _precision_of(folder: pathlib.Path, config: dict) -> str:
    """fp32/fp16/bf16 from the decoder's logits type (folders without a recipe)."""
    import onnx
    m = gf.graph(gf.decoder_path(folder, config))
    et = next((o.type.tensor_type.elem_type for o in m.graph.output if o.name == "logits"), onnx.TensorProto.FLOAT)
    return {onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}.get(et, "fp32")
