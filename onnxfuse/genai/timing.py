"""`onnxfuse bench genai DIR [DIR ...]`: genai folders timed in one process, one run, with the same prompts.

Per folder, batch, prompt length and mode (plain; on the GPU also genai's CUDA graph): the prefill (append_tokens over
the prompt of each of the batch's sequences) and the decode (generate_next_token, NEW tokens for every sequence),
medians over the runs after warm-up. Decode is bound by
reading the weights once per token, so each row carries the decoder's weight bytes over the decode time (GB/s) and
that as a share of the memory rate measured in the same run (the practical limit): a device-to-device copy on the
GPU, a read with torch's threads on the CPU (cpu_read_gbs). The first
folder is the baseline: every other row gets its time ratio against it (above 1: faster).
"""
from __future__ import annotations

import datetime
import platform
import statistics
import time

import numpy as np

from .. import onnxio
from . import folder as gf
from .generate import kv_length, load_model


def weight_bytes(m) -> int:
    """Bytes of the decoder's initializers, external and inline (`m`: its graph, folder.graph)."""
    total = 0
    for t in m.graph.initializer:
        ext = {e.key: e.value for e in t.external_data}
        total += int(ext["length"]) if "length" in ext else len(t.raw_data)
    return total


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


def time_folder(folder, *, provider: str, cuda_graph: bool, prompt_tokens: int, new_tokens: int, runs: int,
                warmup: int, seed: int = 0, batch: int = 1) -> dict:
    og, model = load_model(folder, provider, cuda_graph)
    config = gf.read_config(folder)
    vocab = int(config["model"]["vocab_size"])
    rng = np.random.default_rng(seed)
    ids = rng.integers(min(100, vocab // 2), vocab - 1, prompt_tokens).tolist() if batch == 1 else \
        rng.integers(min(100, vocab // 2), vocab - 1, (batch, prompt_tokens)).astype(np.int32)
    prefill, decode = [], []
    for r in range(warmup + runs):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=kv_length(config, prompt_tokens + new_tokens), do_sample=False,
                                  min_length=prompt_tokens + new_tokens,  # no stop at EOS: the same work each run
                                  batch_size=batch)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(ids)
        gen.get_logits()  # the prefill has finished
        t1 = time.perf_counter()
        for _ in range(new_tokens):
            gen.generate_next_token()
        gen.get_next_tokens()
        t2 = time.perf_counter()
        if r >= warmup:
            prefill.append((t1 - t0) * 1e3)
            decode.append((t2 - t1) * 1e3 / new_tokens)
        del gen
    del model
    # decode_ms_per_token is one step's time (a token for every sequence of the batch)
    return {"batch": batch, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "cuda_graph": cuda_graph,
            "prefill_ms": statistics.median(prefill), "prefill_ms_p10_p90": _p10_p90(prefill),
            "decode_ms_per_token": statistics.median(decode), "decode_ms_p10_p90": _p10_p90(decode),
            "decode_tokens_per_s": batch * 1e3 / statistics.median(decode)}


def _p10_p90(v: list[float]) -> list[float]:
    return [float(np.percentile(v, 10)), float(np.percentile(v, 90))]


def bench(folders: list, *, provider: str = "cpu", sizes: list[int] | None = None, new_tokens: int = 64,
          runs: int = 5, warmup: int = 2, progress=None, batches: list[int] | None = None) -> dict:
    """Time every folder at every batch and prompt length, plain and (on cuda) with CUDA graphs; the result as JSON
    data. A decode step reads every weight once whatever the batch, so its weight rate is the weights over the
    step's time at every batch."""
    import onnxruntime
    import onnxruntime_genai
    sizes = sizes or [128]
    batches = batches or [1]
    modes = [False, True] if provider == "cuda" else [False]
    peak = copy_peak_gbs() if provider == "cuda" else cpu_read_gbs()
    rows, skipped = [], []
    if provider == "cuda" and any(b > 1 for b in batches):
        # genai 0.18's CUDA-graph mode (KV buffers shared between steps) refuses a batched prompt: onnxruntime's
        # GroupQueryAttention says "batch_size must be 1 when sequence_length > 1 and past context is given"
        skipped.append("CUDA graph at batch > 1: genai 0.18 refuses a batched prompt there")
    for folder in folders:
        decoder = gf.graph(gf.decoder_path(folder))
        nbytes, counts = weight_bytes(decoder), onnxio.op_counts(decoder)
        del decoder
        recipe = gf.read_recipe(folder) or {}
        for cuda_graph in modes:
            for batch, size in ((b, z) for b in batches for z in sizes):
                if cuda_graph and batch > 1:
                    continue
                if progress:
                    progress(f"{folder}{f' batch {batch}' if batch > 1 else ''} prompt {size}"
                             f"{' cuda graph' if cuda_graph else ''}")
                row = time_folder(folder, provider=provider, cuda_graph=cuda_graph, prompt_tokens=size,
                                  new_tokens=new_tokens, runs=runs, warmup=warmup, batch=batch)
                gbs = nbytes / (row["decode_ms_per_token"] / 1e3) / 1e9
                row.update(folder=str(folder), weight_bytes=nbytes, decode_weight_gbs=gbs,
                           decode_pct_of_copy=None if peak is None else 100 * gbs / peak,
                           fused={k: v for k, v in counts.items() if k.startswith("onnxfuse::")},
                           precision=recipe.get("precision"))
                rows.append(row)
    base = {(r["cuda_graph"], r["batch"], r["prompt_tokens"]): r for r in rows if r["folder"] == str(folders[0])}
    for r in rows:
        b = base.get((r["cuda_graph"], r["batch"], r["prompt_tokens"]))
        if b is not None:
            r["prefill_speedup_vs_first"] = b["prefill_ms"] / r["prefill_ms"]
            r["decode_speedup_vs_first"] = b["decode_ms_per_token"] / r["decode_ms_per_token"]
    return {"kind": "genai", "date": datetime.date.today().isoformat(), "provider": provider,
            "device": _device(provider), "versions": {"onnxruntime": onnxruntime.__version__,
                                                      "onnxruntime_genai": onnxruntime_genai.__version__},
            "copy_peak_gbs": peak if provider == "cuda" else None,
            "read_peak_gbs": peak if provider != "cuda" else None, "runs": runs, "warmup": warmup, "rows": rows,
            "skipped": skipped,
            "note": "decode_weight_gbs: the decoder's weight bytes over the median decode time per token (each token "
                    "reads every weight once); decode_pct_of_copy: that over the same-run device-to-device copy "
                    "rate (its read plus write bytes: what the memory moves at most; on the CPU the same-run read "
                    "rate with torch's threads, cpu_read_gbs)"}


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
    lines = [f"{'folder':40} {'graph':5} {'batch':>5} {'prompt':>6} {'prefill ms':>10} {'decode ms/tok':>13} "
             f"{'tok/s':>7} {'GB/s':>7} {'%peak':>6} {'vs first':>9}"]
    for r in result["rows"]:
        pct = f"{r['decode_pct_of_copy']:.0f}" if r["decode_pct_of_copy"] is not None else "-"
        vs = f"{r.get('decode_speedup_vs_first', 1):.3f}x"
        lines.append(f"{r['folder'][-40:]:40} {'yes' if r['cuda_graph'] else 'no':5} {r.get('batch', 1):>5} "
                     f"{r['prompt_tokens']:>6} "
                     f"{r['prefill_ms']:>10.2f} {r['decode_ms_per_token']:>13.3f} {r['decode_tokens_per_s']:>7.1f} "
                     f"{r['decode_weight_gbs']:>7.0f} {pct:>6} {vs:>9}")
    return "\n".join(lines)
