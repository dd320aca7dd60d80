"""Text from a genai folder: transformers tokenizes (genai's own tokenizer gave ids of -1 for a GGUF-derived
tokenizer.json), genai's Generator runs the decoder with its KV cache, and the time to the first token (prefill)
and the decode rate are measured around it."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Callable

from .. import host
from ..errors import OnnxfuseError
from . import folder as gf


@dataclasses.dataclass
class Sampling:
    """Greedy by default; temperature/top_p/top_k/seed sample."""
    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 50
    seed: int | None = None


@dataclasses.dataclass
class Generation:
    prompt_ids: list[int]
    new_ids: list[int]
    text: str
    prefill_ms: float
    decode_tokens_per_s: float | None
    stopped_at_eos: bool

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def genai(provider: str = "cpu"):
    """The onnxruntime_genai module, checked for `provider`."""
    try:
        import onnxruntime_genai as og
    except ImportError:
        raise OnnxfuseError("onnxruntime-genai is not installed: pip install 'onnxfuse[genai]' (CPU) or "
                            "onnxruntime-genai-cuda (GPU)") from None
    if provider == "cuda" and not og.is_cuda_available():
        raise OnnxfuseError("--provider cuda needs the CUDA build of onnxruntime-genai: pip install "
                            "onnxruntime-genai-cuda (and onnxruntime-gpu) in place of onnxruntime-genai")
    return og


def cpu_threads(config: dict) -> int | None:
    """The intra-op threads onnxfuse runs a CPU folder's decoder with: its genai_config.json's own
    `intra_op_num_threads` if it sets one (None: left as it is), else this host's physical cores. genai's session
    otherwise takes onnxruntime's default, which was one thread on a 2-core VM (SmolLM2-135M fp32 decode 36.0 ms/token
    against 19.3 with two threads; benchmarks/results/cpu-avx512-2core-2026-11-28/genai-smollm2-threads.json)."""
    options = config["model"]["decoder"].get("session_options", {})
    return None if "intra_op_num_threads" in options else host.physical_cores()


def load_model(folder: pathlib.Path, provider: str | None = None, cuda_graph: bool = False):
    """genai's Model for `folder` on `provider` (default: the one the folder was built for); `cuda_graph`: genai
    captures the decode step in a CUDA graph (its KV buffers are shared between steps, as the builder sets)."""
    config = gf.read_config(folder)
    provider = provider or gf.provider_of(config)
    if cuda_graph and provider != "cuda":
        raise OnnxfuseError("--cuda-graph needs --provider cuda")
    og = genai(provider)
    cfg = og.Config(str(folder))
    cfg.clear_providers()
    threads = cpu_threads(config) if provider == "cpu" else None
    if threads:
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    if provider == "cuda":
        cfg.append_provider("cuda")
        if cuda_graph:
            cfg.set_provider_option("cuda", "enable_cuda_graph", "1")
    try:
        return og, og.Model(cfg)
    except Exception as e:
        raise OnnxfuseError(f"{folder}: onnxruntime-genai cannot load it ({str(e).splitlines()[0][:240]}); "
                            "rebuild it with 'onnxfuse export hf'") from None


def prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise OnnxfuseError("--chat: this tokenizer has no chat template; leave out --chat for plain text")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5 returns a mapping
    else:
        ids = tokenizer(prompt)["input_ids"]
    return [int(i) for i in ids]


def context_length(config: dict) -> int:
    return int(config["model"].get("context_length") or config.get("search", {}).get("max_length"))


def kv_length(config: dict, needed: int) -> int:
    """The generator's max_length for `needed` tokens: genai sizes the KV cache by it, and a model with sliding-window
    attention (Gemma 2/3) needs at least the window (capped by the context)."""
    window = config["model"]["decoder"].get("sliding_window", {}).get("window_size") or 0
    return min(context_length(config), max(needed, int(window)))


def generate(folder: pathlib.Path, prompt: str, *, chat: bool = False, max_new_tokens: int = 128,
             sampling: Sampling | None = None, provider: str | None = None, cuda_graph: bool = False,
             on_text: Callable[[str], None] | None = None, tokenizer=None, adapter: str | None = None) -> Generation:
    """Generate up to `max_new_tokens` after `prompt`; `on_text` receives the text as it grows (new pieces);
    `adapter`: the folder's LoRA adapter of that name (`<adapter>.onnx_adapter`) is active."""
    from .source import load_tokenizer
    sampling = sampling or Sampling()
    config = gf.read_config(folder)
    tokenizer = tokenizer or load_tokenizer(folder)
    ids = prompt_ids(tokenizer, prompt, chat)
    limit = context_length(config)
    if not ids:
        raise OnnxfuseError("the prompt has no tokens for this tokenizer; give a non-empty --prompt")
    if len(ids) >= limit:
        raise OnnxfuseError(f"the prompt is {len(ids)} tokens; the model's context holds {limit}: shorten it")
    og, model = load_model(folder, provider, cuda_graph)
    params = og.GeneratorParams(model)
    options = {"max_length": kv_length(config, len(ids) + max_new_tokens), "do_sample": not sampling.greedy}
    if not sampling.greedy:
        options.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        if sampling.seed is not None:
            options["random_seed"] = sampling.seed
    params.set_search_options(**options)
    gen = og.Generator(model, params)
    adapters = activate_adapter(og, model, gen, folder, adapter) if adapter is not None else None  # kept alive
    eos = _eos_ids(config, tokenizer)
    t0 = time.perf_counter()
    gen.append_tokens(ids)  # the prefill: runs the decoder over the prompt
    prefill_ms = (time.perf_counter() - t0) * 1e3
    new: list[int] = []
    shown = ""
    t1 = time.perf_counter()
    stopped = False
    while not gen.is_done() and len(new) < max_new_tokens:
        gen.generate_next_token()
        token = int(gen.get_next_tokens()[0])
        if token in eos:
            stopped = True
            break
        new.append(token)
        if on_text is not None:
            text = tokenizer.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            if not text.endswith("\ufffd"):  # a multi-byte character still incomplete
                on_text(text[len(shown):])
                shown = text
    decode_s = time.perf_counter() - t1
    steps = len(new) + int(stopped)  # generate_next_token calls: each picks a token and runs the decoder on it
    rate = steps / decode_s if steps > 0 and decode_s > 0 else None
    text = tokenizer.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if on_text is not None and text[len(shown):]:
        on_text(text[len(shown):])
    del adapters
    return Generation(ids, new, text, prefill_ms, rate, stopped)


def activate_adapter(og, model, generator, folder: pathlib.Path, name: str):
    """Load `<folder>/<name>.onnx_adapter` into genai's Adapters and make it the generator's active adapter; returns
    the Adapters (keep it while the generator runs)."""
    path = folder / f"{name}.onnx_adapter"
    if not path.is_file():
        have = sorted(p.name.removesuffix(".onnx_adapter") for p in folder.glob("*.onnx_adapter"))
        raise OnnxfuseError(f"--adapter {name}: {folder} has no {path.name} (its adapters: "
                            f"{', '.join(have) or 'none'}; 'export hf --adapter' writes them)")
    adapters = og.Adapters(model)
    adapters.load(str(path), name)
    generator.set_active_adapter(adapters, name)
    return adapters


def _eos_ids(config: dict, tokenizer) -> set[int]:
    eos = config["model"].get("eos_token_id")
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
