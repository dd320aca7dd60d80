"""`onnxfuse bench genai DIR [DIR ...]`: genai folders timed in one process, one run, with the same prompts.

Per folder, batch, prompt length and mode (plain; on the GPU also genai's CUDA graph): the prefill (append_tokens over
the prompt of each of the batch's sequences) and the decode (generate_next_token, NEW tokens for every sequence),
medians over the runs after warm-up. Decode is bound by
reading the weights once per token, so each row carries the decoder's weight bytes over the decode time (GB/s) and
that as a share of the memory rate measured in the same run (the practical limit): a device-to-device copy on the
GPU, a read with torch's threads on the CPU (cpu_read_gbs). Each row also has its limits (decoder_shape gives what
they need): the prefill's FLOPs (the linear layers' and the causal attention's) at the same run's GEMM peak, and the
bytes a decode step reads (the weights and the batch's KV cache at the steps' mean context) at the memory rate, with
the measured time's share of each (100 %: at the limit). The first
folder is the baseline: every other row gets its time ratio against it (above 1: faster).
"""
from __future__ import annotations

import datetime
import pathlib
import platform
import statistics
import time

import numpy as np

from .. import onnxio
from . import folder as gf
from .generate import cpu_threads, kv_length, load_model


def _bytes(t) -> int:
    """An initializer's bytes, external or inline."""
    ext = {e.key: e.value for e in t.external_data}
    return int(ext["length"]) if "length" in ext else len(t.raw_data)


def weight_bytes(m) -> int:
    """Bytes of the decoder's initializers, external and inline (`m`: its graph, folder.graph)."""
    return sum(_bytes(t) for t in m.graph.initializer)


_GEMM_OPS = {("", "MatMul"), ("ai.onnx", "MatMul"), ("", "Gemm"), ("ai.onnx", "Gemm"),
             ("com.microsoft", "MatMulNBits")}
_NOT_WEIGHTS = ("scales", "zero_points")  # int4 ops' 2-D scales are not weights (biases and the rest: not 2-D)
_FLOAT_TYPES = {1: 4, 10: 2, 16: 2}  # onnx float, float16, bfloat16: bytes
_PRUNE_OPS = {"Gather", "Slice"}


def _weight_macs(data_type: int, dims: list[int], bits: int) -> int:
    """K x N of a GEMM weight initializer: a 2-D float matrix, or 4/8-bit blocks packed [N, blocks, bytes]; 0 for
    anything else (scales, zero points, biases)."""
    n = 1
    for d in dims:
        n *= d
    if data_type in _FLOAT_TYPES and len(dims) == 2:
        return n
    if data_type == 2 and len(dims) == 3:  # uint8
        return n * 8 // bits
    return 0


_LOOKUPS = {("", "Gather"), ("ai.onnx", "Gather"), ("com.microsoft", "GatherBlockQuantized")}


def _onnxfuse_role(op: str) -> str | None:
    """"gemm" for an onnxfuse op with weights (an input W...: the GEMM families), "lookup" for one reading rows of a
    table (an input `table`), else None (schema.py's input names)."""
    from .. import schema
    inputs = schema.OPS[op].inputs if op in schema.OPS else ()
    return "gemm" if any(i.startswith("W") for i in inputs) else "lookup" if "table" in inputs else None


def _is_lookup(domain: str, op: str) -> bool:
    from .. import schema
    return (domain, op) in _LOOKUPS or (domain == schema.DOMAIN and _onnxfuse_role(op) == "lookup")


def decoder_shape(m, config: dict) -> dict:
    """What the limits need from a genai decoder (`m`: its graph, folder.graph; `config`: genai_config.json): the
    multiply-adds a token costs in the linear layers (`macs`: every GEMM's weight, K x N: ai.onnx MatMul and Gemm on a
    2-D initializer, MatMulNBits and onnxfuse's int4 ops from their packed bytes, onnxfuse's other GEMM ops from
    their weight initializers), the lm_head's part of it (the MatMul making `logits`) and whether the builder pruned
    it (prune_lm_head: a Gather or Slice before it, so a prefill computes the last position's logits only), the
    bytes of the lookup tables (initializers only a Gather or Embedding reads: a step reads a row of them), the
    layers, heads, KV heads and head size (genai_config.json) and the KV cache's element bytes (its past_key_values
    inputs)."""
    from .. import schema
    inits = {t.name: (t.data_type, list(t.dims)) for t in m.graph.initializer}
    producer = {o: n for n in m.graph.node for o in n.output}
    consumers: dict[str, set] = {}
    for node in m.graph.node:
        for x in node.input:
            consumers.setdefault(x, set()).add((node.domain, node.op_type))
    table_bytes = sum(_bytes(t) for t in m.graph.initializer
                      if consumers.get(t.name) and all(_is_lookup(*c) for c in consumers[t.name]))
    macs, lm_head, pruned = 0, 0, False
    for node in m.graph.node:
        bits = next((a.i for a in node.attribute if a.name == "bits"), 4)
        if (node.domain, node.op_type) in _GEMM_OPS:
            names = list(node.input[1:2])
        elif node.domain == schema.DOMAIN and _onnxfuse_role(node.op_type) == "gemm":
            spec = schema.OPS[node.op_type].inputs  # past its end: MLPStack's repeated W_i, bias_i
            names = [x for i, x in enumerate(node.input)
                     if i >= 1 and not (i < len(spec) and spec[i].startswith(_NOT_WEIGHTS))]
        else:
            continue
        node_macs = sum(_weight_macs(*inits[x], bits) for x in names if x in inits)
        macs += node_macs
        if "logits" in node.output:
            lm_head = node_macs
            up = producer.get(node.input[0])
            hops = [up, producer.get(up.input[0]) if up is not None and up.input else None]
            pruned = any(h is not None and h.op_type in _PRUNE_OPS for h in hops)
    dec = config["model"]["decoder"]
    kv = next((i for i in m.graph.input if i.name.startswith("past_key_values.") and i.name.endswith(".key")), None)
    return {"macs": macs, "lm_head_macs": lm_head, "lm_head_pruned": pruned, "table_bytes": table_bytes,
            "layers": int(dec["num_hidden_layers"]), "heads": int(dec["num_attention_heads"]),
            "kv_heads": int(dec.get("num_key_value_heads", dec["num_attention_heads"])),
            "head_size": int(dec["head_size"]),
            "kv_bytes": None if kv is None else _FLOAT_TYPES.get(kv.type.tensor_type.elem_type)}


def prefill_flops(shape: dict, batch: int, tokens: int) -> int:
    """FLOPs of a prefill of `tokens` tokens for each of `batch` sequences: 2 per multiply-add of the linear layers at
    every position (the lm_head at the last one where pruned), and the causal attention's Q K^T and P V (2 x 2 x
    head size FLOPs for each of the S (S + 1) / 2 query-key pairs of every head and layer)."""
    lm = shape["lm_head_macs"]
    per_seq = 2 * (shape["macs"] - lm) * tokens + 2 * lm * (1 if shape["lm_head_pruned"] else tokens)
    per_seq += shape["layers"] * shape["heads"] * 2 * shape["head_size"] * tokens * (tokens + 1)
    return batch * per_seq


def decode_bytes(shape: dict, weight_bytes: int, batch: int, prompt: int, new_tokens: int) -> int | None:
    """Bytes a decode step reads at least: every weight once but the lookup tables (a row of them), and each
    sequence's K and V cache at the steps' mean context (prompt + (new - 1) / 2 positions); None where the KV cache's
    type is unknown."""
    if shape["kv_bytes"] is None:
        return None
    context = prompt + (new_tokens - 1) / 2
    kv = 2 * shape["layers"] * shape["kv_heads"] * shape["head_size"] * context * shape["kv_bytes"]
    return int(weight_bytes - shape.get("table_bytes", 0) + batch * kv)


def copy_peak_gbs() -> float | None:
    """Device-to-device copy bandwidth (read + write) of this GPU, GB/s; None without torch's CUDA."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del a, b
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / statistics.median(times) / 1e9


def cpu_read_gbs(nbytes: int = 1 << 29) -> float | None:
    """Memory read bandwidth of this host with torch's intra-op threads (one per core, as onnxruntime's CPU EP
    uses), GB/s: a sum over a float32 buffer far past any cache. Decode only reads the weights, so this is its
    practical limit on the CPU (a copy's read plus write runs slower there). None without torch."""
    try:
        import torch
    except ImportError:
        return None
    a = torch.ones(nbytes // 4, dtype=torch.float32)
    for _ in range(2):
        a.sum()
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        a.sum()
        times.append(time.perf_counter() - t0)
    del a
    return nbytes / statistics.median(times) / 1e9


def _prompt(vocab: int, batch: int, prompt_tokens: int, seed: int):
    """The run's prompt ids: the same for every folder and for transformers (a list at batch 1, else [batch, S])."""
    rng = np.random.default_rng(seed)
    return rng.integers(min(100, vocab // 2), vocab - 1, prompt_tokens).tolist() if batch == 1 else \
        rng.integers(min(100, vocab // 2), vocab - 1, (batch, prompt_tokens)).astype(np.int32)


def refusal(e: Exception) -> str:
    """The first line of what genai or onnxruntime said when it refused a call (its type where it said nothing)."""
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def time_folders(folders, *, provider: str, cuda_graph: bool, prompt_tokens: int, new_tokens: int, runs: int,
                 warmup: int, seed: int = 0, batch: int = 1, refused: dict | None = None) -> list[dict]:
    """Each folder's prefill and decode times on the same prompt, the folders' runs taken in turn (run r of every
    folder, then run r + 1), so that a host whose speed drifts (a shared CPU, a GPU's clocks) moves them alike: one
    dict per folder, medians over `runs` after `warmup`. `refused` (a dict): a folder whose first prompt genai or
    onnxruntime refuses is left out of the runs and its reason put there under its index (a batched prompt in genai
    0.18's CUDA-graph mode: onnxruntime's GroupQueryAttention refuses it, a fused CachedAttention takes it); without
    it such an error propagates. The rows of the folders left out are None."""
    loaded = [load_model(folder, provider, cuda_graph) for folder in folders]
    configs = [gf.read_config(folder) for folder in folders]
    ids = _prompt(int(configs[0]["model"]["vocab_size"]), batch, prompt_tokens, seed)
    prefill, decode = [[] for _ in folders], [[] for _ in folders]
    for r in range(warmup + runs):
        for i, ((og, model), config) in enumerate(zip(loaded, configs)):
            if refused is not None and i in refused:
                continue
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=kv_length(config, prompt_tokens + new_tokens), do_sample=False,
                                      min_length=prompt_tokens + new_tokens,  # no stop at EOS: the same work each run
                                      batch_size=batch)
            gen = og.Generator(model, params)
            t0 = time.perf_counter()
            try:
                gen.append_tokens(ids)
            except Exception as e:  # genai and onnxruntime raise plain RuntimeErrors
                if refused is None or r > 0:
                    raise
                refused[i] = refusal(e)
                del gen
                continue
            gen.get_logits()  # the prefill has finished
            t1 = time.perf_counter()
            for _ in range(new_tokens):
                gen.generate_next_token()
            gen.get_next_tokens()
            t2 = time.perf_counter()
            if r >= warmup:
                prefill[i].append((t1 - t0) * 1e3)
                decode[i].append((t2 - t1) * 1e3 / new_tokens)
            del gen
    del loaded
    # decode_ms_per_token is one step's time (a token for every sequence of the batch)
    return [None if not p else
            {"batch": batch, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "cuda_graph": cuda_graph,
             "threads": cpu_threads(config) if provider == "cpu" else None,
             "prefill_ms": statistics.median(p), "prefill_ms_p10_p90": _p10_p90(p),
             "decode_ms_per_token": statistics.median(d), "decode_ms_p10_p90": _p10_p90(d),
             "decode_tokens_per_s": batch * 1e3 / statistics.median(d)}
            for config, p, d in zip(configs, prefill, decode)]


TRANSFORMERS_MODES = ("eager", "compile")


def time_transformers(model, *, mode: str, vocab: int, prompt_tokens: int, new_tokens: int, runs: int, warmup: int,
                      seed: int = 0, batch: int = 1) -> dict:
    """The same prompt through the checkpoint's transformers CausalLM (`model`, on its device), greedy, the way a
    PyTorch user runs it: `eager` (its DynamicCache) or `compile` (a StaticCache of the prompt plus the new tokens and
    the forward through torch.compile, as transformers' static-cache generation does, without CUDA graphs); the
    prefill computes the last position's logits (logits_to_keep=1, as generate does). Medians like time_folders'."""
    import torch
    import transformers
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    x = torch.tensor(np.asarray(_prompt(vocab, batch, prompt_tokens, seed)).reshape(batch, prompt_tokens),
                     dtype=torch.long, device=device)
    forward = model.forward
    if mode == "compile":
        # inductor's default mode: its CUDA graphs (reduce-overhead) skip a static cache's mutated buffers and
        # crashed (a segfault) beside onnxruntime's CUDA session in one process on an H100 (2026-11-28)
        forward = torch.compile(model.forward, dynamic=False)
        warmup = max(warmup, 2)  # the prefill's and the decode step's graphs compile in the first runs
    prefill, decode = [], []
    # one static cache, reset each run: its buffers keep their addresses, which the compiled graphs were captured on
    static = transformers.StaticCache(config=model.config, max_cache_len=prompt_tokens + new_tokens) \
        if mode == "compile" else None
    with torch.no_grad():
        for r in range(warmup + runs):
            if static is not None:
                static.reset()
            cache = static
            sync()
            t0 = time.perf_counter()
            out = forward(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1,
                          cache_position=torch.arange(prompt_tokens, device=device))
            token = out.logits[:, -1:].argmax(-1)
            sync()
            t1 = time.perf_counter()
            cache = out.past_key_values
            for i in range(new_tokens):
                out = forward(input_ids=token, past_key_values=cache, use_cache=True,
                              cache_position=torch.tensor([prompt_tokens + i], device=device))
                token = out.logits[:, -1:].argmax(-1)
                cache = out.past_key_values
            sync()
            t2 = time.perf_counter()
            if r >= warmup:
                prefill.append((t1 - t0) * 1e3)
                decode.append((t2 - t1) * 1e3 / new_tokens)
    return {"batch": batch, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "cuda_graph": False,
            "prefill_ms": statistics.median(prefill), "prefill_ms_p10_p90": _p10_p90(prefill),
            "decode_ms_per_token": statistics.median(decode), "decode_ms_p10_p90": _p10_p90(decode),
            "decode_tokens_per_s": batch * 1e3 / statistics.median(decode)}


def _transformers_rows(folder, modes: list[str], *, provider: str, sizes, batches, new_tokens: int, runs: int,
                       warmup: int, progress, limits) -> list[dict]:
    """time_transformers for every mode, batch and prompt length, on the checkpoint `folder` was built from (its
    recipe's source), in the folder's activation type (fp16 on the GPU, fp32 on the CPU)."""
    import tempfile

    import torch

    from .check import source_of
    from .source import load_causal_lm
    vocab = int(gf.read_config(folder)["model"]["vocab_size"])
    dtype = torch.float16 if provider == "cuda" else torch.float32
    rows = []
    with tempfile.TemporaryDirectory() as work:
        model = load_causal_lm(source_of(folder, gf.read_recipe(folder), None, pathlib.Path(work)), dtype)
        model.to("cuda" if provider == "cuda" else "cpu")
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        table = model.get_input_embeddings().weight
        out = model.get_output_embeddings()
        # the input embedding is a lookup table (a row a step) unless the lm_head reads it (tied)
        table_bytes = 0 if out is not None and out.weight is table else table.numel() * table.element_size()
        for mode in modes:
            for batch, size in ((b, z) for b in batches for z in sizes):
                if progress:
                    progress(f"transformers {mode}{f' batch {batch}' if batch > 1 else ''} prompt {size}")
                row = time_transformers(model, mode=mode, vocab=vocab, prompt_tokens=size, new_tokens=new_tokens,
                                        runs=runs, warmup=warmup, batch=batch)
                row.update(folder=f"transformers {mode}", kind="transformers", weight_bytes=nbytes, fused={},
                           precision="fp16" if provider == "cuda" else "fp32")
                rows.append(limits(row, nbytes, table_bytes))
                if provider == "cuda":
                    torch.cuda.empty_cache()
        del model
    return rows


def _p10_p90(v: list[float]) -> list[float]:
    return [float(np.percentile(v, 10)), float(np.percentile(v, 90))]


def bench(folders: list, *, provider: str = "cpu", sizes: list[int] | None = None, new_tokens: int = 64,
          runs: int = 5, warmup: int = 2, progress=None, batches: list[int] | None = None,
          transformers_modes: list[str] | None = None, gemm_peak=None) -> dict:
    """Time every folder at every batch and prompt length, plain and (on cuda) with CUDA graphs, and the first
    folder's checkpoint through transformers in `transformers_modes` (TRANSFORMERS_MODES); the result as JSON data.
    gemm_peak(provider, dtype) -> {"peak_tflops", "peak_gemm"}: the run's GEMM peak in the decoder's activation type
    (the bench command passes bench.harness.measure_ceilings'); without it, no prefill limit.
    A decode step reads every weight once whatever the batch, so its weight rate is the weights over the step's time
    at every batch."""
    import onnxruntime
    import onnxruntime_genai
    sizes = sizes or [128]
    batches = batches or [1]
    modes = [False, True] if provider == "cuda" else [False]
    peak = copy_peak_gbs() if provider == "cuda" else cpu_read_gbs()
    rows, skipped, gemm = [], [], None
    about = []  # per folder: its weight bytes, onnxfuse ops, shape and recipe
    by_folder = [[] for _ in folders]
    for folder in folders:
        decoder = gf.graph(gf.decoder_path(folder))
        nbytes, counts = weight_bytes(decoder), onnxio.op_counts(decoder)
        shape = decoder_shape(decoder, gf.read_config(folder))
        del decoder
        if gemm is None:
            dtype = "fp16" if provider == "cuda" and shape["kv_bytes"] == 2 else "fp32"
            gemm = gemm_peak(provider, dtype) if gemm_peak else {"peak_tflops": None, "peak_gemm": None}
        about.append((nbytes, counts, shape, gf.read_recipe(folder) or {}))
    for cuda_graph in modes:
        for batch, size in ((b, z) for b in batches for z in sizes):
            if progress:
                progress(f"{len(folders)} folder(s){f' batch {batch}' if batch > 1 else ''} prompt {size}"
                         f"{' cuda graph' if cuda_graph else ''}")
            # genai 0.18's CUDA-graph mode (KV buffers shared between steps) feeds a prompt with past context (its
            # static mask's length): onnxruntime's GroupQueryAttention refuses a batch of them ("batch_size must be
            # 1 when sequence_length > 1 and past context is given"), a fused CachedAttention runs it
            refused = {} if cuda_graph and batch > 1 else None
            timed = time_folders(folders, provider=provider, cuda_graph=cuda_graph, prompt_tokens=size,
                                 new_tokens=new_tokens, runs=runs, warmup=warmup, batch=batch, refused=refused)
            for i, reason in sorted((refused or {}).items()):
                skipped.append(f"{folders[i]}: CUDA graph at batch {batch}, prompt {size}: refused ({reason})")
            for i, (folder, row, (nbytes, counts, shape, recipe)) in enumerate(zip(folders, timed, about)):
                if row is None:
                    continue
                row.update(folder=str(folder), weight_bytes=nbytes,
                           fused={k: v for k, v in counts.items() if k.startswith("onnxfuse::")},
                           precision=recipe.get("precision"), decoder_shape=shape)
                by_folder[i].append(_limits(row, nbytes, shape, gemm, peak))
    rows = [row for folder_rows in by_folder for row in folder_rows]  # a folder's rows together, in the run's order
    if transformers_modes:
        # its prefill computes the last position's logits only (logits_to_keep=1): the first folder's shape with the
        # lm_head counted once, as in a folder whose lm_head the builder pruned
        first = dict(rows[0]["decoder_shape"], lm_head_pruned=True)
        rows += _transformers_rows(folders[0], transformers_modes, provider=provider, sizes=sizes, batches=batches,
                                   new_tokens=new_tokens, runs=runs, warmup=warmup, progress=progress,
                                   limits=lambda row, nbytes, table: _limits(
                                       row, nbytes, dict(first, table_bytes=table), gemm, peak))
    _vs_first(rows, str(folders[0]))
    return {"kind": "genai", "date": datetime.date.today().isoformat(), "provider": provider,
            "device": _device(provider), "versions": {"onnxruntime": onnxruntime.__version__,
                                                      "onnxruntime_genai": onnxruntime_genai.__version__},
            "copy_peak_gbs": peak if provider == "cuda" else None,
            "read_peak_gbs": peak if provider != "cuda" else None, **(gemm or {}), "runs": runs, "warmup": warmup,
            "rows": rows, "skipped": skipped,
            "note": "decode_weight_gbs: the decoder's weight bytes over the median decode time per token (each token "
                    "reads every weight once); decode_pct_of_copy: that over the same-run device-to-device copy "
                    "rate (its read plus write bytes: what the memory moves at most; on the CPU the same-run read "
                    "rate with torch's threads, cpu_read_gbs). prefill_limit_ms: prefill_flops (the linear layers' "
                    "and the causal attention's) at the same-run GEMM peak (peak_tflops); decode_limit_ms: "
                    "decode_bytes (the weights and the batch's KV cache at the mean context) at that memory rate; "
                    "*_pct_of_limit: the limit over the measured median (100: at the limit; above it where a tiny "
                    "model's weights stay in cache)"}


def _vs_first(rows: list[dict], first_folder: str) -> None:
    """Each row's prefill and decode speedups against the first folder's row of the same mode, batch and prompt; where
    the first folder has none in that mode (its batched prompt refused in the CUDA graph), against its fastest decode
    at that batch and prompt, whose mode the row names (vs_first_cuda_graph)."""
    first = [r for r in rows if r["folder"] == first_folder]
    base = {(r["cuda_graph"], r["batch"], r["prompt_tokens"]): r for r in first}
    for r in rows:
        b = base.get((r["cuda_graph"], r["batch"], r["prompt_tokens"]))
        if b is None:
            others = [x for x in first if (x["batch"], x["prompt_tokens"]) == (r["batch"], r["prompt_tokens"])]
            b = min(others, key=lambda x: x["decode_ms_per_token"], default=None)
            if b is not None:
                r["vs_first_cuda_graph"] = b["cuda_graph"]
        if b is not None:
            r["prefill_speedup_vs_first"] = b["prefill_ms"] / r["prefill_ms"]
            r["decode_speedup_vs_first"] = b["decode_ms_per_token"] / r["decode_ms_per_token"]


def _limits(row: dict, nbytes: int, shape: dict, gemm: dict, peak: float | None) -> dict:
    """A timed row with its weight rate and limits (the module's docstring)."""
    gbs = nbytes / (row["decode_ms_per_token"] / 1e3) / 1e9
    batch, size = row["batch"], row["prompt_tokens"]
    flops = prefill_flops(shape, batch, size)
    prefill_limit = None if not gemm["peak_tflops"] else flops / (gemm["peak_tflops"] * 1e12) * 1e3
    step_bytes = decode_bytes(shape, nbytes, batch, size, row["new_tokens"])
    decode_limit = None if step_bytes is None or peak is None else step_bytes / (peak * 1e9) * 1e3
    row.update(decode_weight_gbs=gbs, decode_pct_of_copy=None if peak is None else 100 * gbs / peak,
               prefill_flops=flops, prefill_limit_ms=prefill_limit,
               prefill_pct_of_limit=None if prefill_limit is None else 100 * prefill_limit / row["prefill_ms"],
               decode_bytes=step_bytes, decode_limit_ms=decode_limit,
               decode_pct_of_limit=None if decode_limit is None else 100 * decode_limit / row["decode_ms_per_token"])
    return row


def _device(provider: str) -> str:
    if provider == "cuda":
        try:
            import torch
            return torch.cuda.get_device_name(0)
        except Exception:
            return "cuda"
    from .. import host
    return f"{platform.processor() or 'CPU'} ({host.kernel_family()})"


def table(result: dict) -> str:
    lines = [f"{'folder':40} {'graph':5} {'batch':>5} {'prompt':>6} {'prefill ms':>10} {'%limit':>6} "
             f"{'decode ms/tok':>13} {'%limit':>6} {'tok/s':>7} {'GB/s':>7} {'%peak':>6} {'vs first':>9}"]
    for r in result["rows"]:
        pct = f"{r['decode_pct_of_copy']:.0f}" if r["decode_pct_of_copy"] is not None else "-"
        pre = f"{r['prefill_pct_of_limit']:.0f}" if r.get("prefill_pct_of_limit") is not None else "-"
        dec = f"{r['decode_pct_of_limit']:.0f}" if r.get("decode_pct_of_limit") is not None else "-"
        vs = "-" if "decode_speedup_vs_first" not in r else \
            f"{r['decode_speedup_vs_first']:.3f}x{'' if 'vs_first_cuda_graph' not in r else '*'}"
        lines.append(f"{r['folder'][-40:]:40} {'yes' if r['cuda_graph'] else 'no':5} {r.get('batch', 1):>5} "
                     f"{r['prompt_tokens']:>6} {r['prefill_ms']:>10.2f} {pre:>6} "
                     f"{r['decode_ms_per_token']:>13.3f} {dec:>6} {r['decode_tokens_per_s']:>7.1f} "
                     f"{r['decode_weight_gbs']:>7.0f} {pct:>6} {vs:>9}")
    limits = [f"prefill limit: its FLOPs at the run's GEMM peak ({result['peak_tflops']} TFLOP/s, "
              f"{result['peak_gemm']})" if result.get("peak_tflops") else None,
              "decode limit: the step's weight and KV-cache bytes at the run's memory rate (%peak's)",
              "*: against the first folder's fastest row at that batch and prompt (it has none in this mode)"
              if any("vs_first_cuda_graph" in r for r in result["rows"]) else None]
    return "\n".join(lines + [x for x in limits if x])
