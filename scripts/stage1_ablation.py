"""Stage-1 ablation for issue #35 (fused CPU ops lose on a 16-thread AVX-512 host).

For each bench case (default llama-7b and llama, quick sizes, fp32) this exports the bench's model (bench.models.
prepare_models, the same cache keys and files `onnxfuse bench` writes), then builds:
  unfused            the exported model
  s1-all             stage 1 (onnxfuse.ort_fusions.apply) with every fusion
  s1-no-<X>          stage 1 leaving out fusion X (skip={X}), for every X that applied or matched
  s1-none-attn       stage 1 leaving out every attention fusion (sdpa, gqa, mha*, attention)
  s1-none-norm       stage 1 leaving out every normalization fusion (rms, skip rms, ...)
  bench-ort          the bench's ort-optimized model (fuse(rules=False): stage 1 after its numeric check)
  fused-cpu          the bench's fused-cpu model (fuse --provider cpu: stage 1 + the rules this host keeps)
  fused-cpu-all      the bench's fused-cpu-all model (stage 1 + every rule)
  rules-cpu          fuse --provider cpu --no-ort-fusions (the rules alone)
  fused-cpu-no-<X>   with --fused-skips: s1-no-<X> then the rules of --provider cpu (fuse(ort=False))
and times them all in onnxruntime's CPU EP in one process, round-robin in blocks (each block: one untimed run, then
--block timed runs; blocks cycle over the variants until --runs timed runs each), for each intra-op thread count of
--threads (0 = onnxruntime's default). ORT's graph optimisations stay at their default (ENABLE_ALL), as in the bench.
Prints one table per (case, size, threads) and writes everything as JSON (--json).

Usage: python stage1_ablation.py [--cases llama-7b,llama] [--size quick|full] [--tokens N] [--threads 0,16,1,4,8]
                                 [--runs 200]
                                 [--lib libonnxfuse_ops.so] [--cache-dir DIR] [--json out.json] [--fused-skips]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

ATTENTION = ("sdpa", "gqa", "packed_qkv_for_gqa", "mha1", "mha2", "mha_scale", "mha_bias", "attention", "sdpa_via_mha")


def log(msg):
    print(f"[ablation {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ops_summary(path) -> str:
    import collections

    import onnx
    m = onnx.load(str(path), load_external_data=False)
    c = collections.Counter((n.domain or "ai.onnx", n.op_type) for n in m.graph.node)
    custom = {f"{d.split('.')[-1]}:{o}": k for (d, o), k in c.items() if d not in ("ai.onnx", "")}
    return f"{sum(c.values())} nodes; " + ", ".join(f"{k}x{v}" for k, v in sorted(custom.items()))


def runnable(path) -> str | None:
    """None, or why onnxruntime cannot run the model (stage-1 intermediate ops left in it)."""
    import onnx
    m = onnx.load(str(path), load_external_data=False)
    left = sorted({f"{n.domain}:{n.op_type}" for n in m.graph.node if n.domain.startswith("ai.onnxruntime._fusion")})
    return f"not runnable: intermediate ops {left} left (the fusion that consumes them was skipped)" if left else None


def stage1_variant(src: pathlib.Path, out: pathlib.Path, skip: set[str]) -> tuple[dict, dict]:
    from onnxscript import ir

    from onnxfuse import ort_fusions
    model = ir.load(str(src))
    applied, intermediate = ort_fusions.apply(model, set(skip))
    ir.save(model, str(out))
    return applied, intermediate


def build_variants(case: str, size: str, tokens: int | None, cache_dir: pathlib.Path, fused_skips: bool,
                   layers: int) -> dict:
    from onnxfuse import fuse
    from onnxfuse.bench import cases, models
    cdef = cases.CASES[case]
    quick = size == "quick"
    tokens = tokens or (cdef.quick_sizes if quick else cdef.sizes)[0]
    w = cdef.make(tokens, "fp32", 0, quick, layers)
    t0 = time.perf_counter()
    info = models.prepare_models(w, "fp32", 0, cache_dir, quiet=False, cpu=True)
    log(f"{case} {size}: bench models ready in {time.perf_counter() - t0:.1f}s: ort_fusions={info.get('ort_fusions')} "
        f"fused_cpu_ops={info.get('fused_cpu_ops')} left_to_ort={list(info.get('left_to_ort') or {})}")
    src = pathlib.Path(info["unfused"])
    stem = cache_dir / f"{w.key}.abl"
    variants = {"unfused": src}
    meta = {"case": case, "size": size, "tokens": tokens, "shape": w.shape, "key": w.key,
            "bench_info": {k: v for k, v in info.items() if k != "left_to_ort"},
            "left_to_ort": info.get("left_to_ort"), "variants": {}}
    t0 = time.perf_counter()
    p = stem.with_name(stem.name + "-s1-all.onnx")
    applied, intermediate = stage1_variant(src, p, set())
    variants["s1-all"] = p
    meta["stage1_applied"], meta["stage1_intermediate"] = applied, intermediate
    log(f"stage 1 all: applied={applied} intermediate={intermediate} ({time.perf_counter() - t0:.1f}s)")
    names = list(applied) + [n for n in intermediate if n not in applied]
    skips = {f"s1-no-{n}": {n} for n in names}
    attn = {n for n in names if n in ATTENTION}
    if len(attn) > 1:
        skips["s1-none-attn"] = attn
    norms = {n for n in names if n.endswith("normalization")}
    if len(norms) > 1:
        skips["s1-none-norm"] = norms
    for vname, skip in skips.items():
        p = stem.with_name(stem.name + f"-{vname}.onnx")
        a, i = stage1_variant(src, p, skip)
        variants[vname] = p
        meta["variants"][vname] = {"skip": sorted(skip), "applied": a, "intermediate": i}
    variants["bench-ort"] = pathlib.Path(info["ort_optimized"])
    variants["fused-cpu"] = pathlib.Path(info["fused_cpu"])
    variants["fused-cpu-all"] = pathlib.Path(info["fused"])
    p = stem.with_name(stem.name + "-rules-cpu.onnx")
    fuse.fuse(src, p, force=True, write_unchanged=True, ort=False, provider="cpu")
    variants["rules-cpu"] = p
    if fused_skips:
        for vname in skips:
            if runnable(variants[vname]) is not None:
                continue
            fname = "fused-cpu-" + vname[3:]  # s1-no-X -> fused-cpu-no-X, s1-none-attn -> fused-cpu-none-attn
            p = stem.with_name(stem.name + f"-{fname}.onnx")
            fuse.fuse(variants[vname], p, force=True, write_unchanged=True, ort=False, provider="cpu")
            variants[fname] = p
    for vname, path in variants.items():
        meta["variants"].setdefault(vname, {})["ops"] = ops_summary(path)
        meta["variants"][vname]["path"] = str(path)
    log(f"variants built ({len(variants)}); {time.perf_counter() - t0:.1f}s")
    feeds = {k: v.numpy() for k, v in w.build_inputs().items()}
    return {"variants": variants, "meta": meta, "feeds": feeds}


class Runner:
    def __init__(self, path, feeds, threads: int, lib):
        import onnxruntime as ort

        from onnxfuse import runtime
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        self.sess = runtime.session(str(path), "cpu", library=lib if lib else None, sess_options=so)
        self.io = self.sess.io_binding()
        names = [i.name for i in self.sess.get_inputs()]
        self.feeds = {n: np.ascontiguousarray(feeds[n]) for n in names}
        for n, a in self.feeds.items():
            self.io.bind_cpu_input(n, a)
        for o in self.sess.get_outputs():
            self.io.bind_output(o.name, "cpu")
        self.sess.run_with_iobinding(self.io)  # first run: output buffers allocated
        outs = self.io.get_outputs()
        self.out = [o.numpy() for o in outs]
        self.io = self.sess.io_binding()
        for n, a in self.feeds.items():
            self.io.bind_cpu_input(n, a)
        for o, y in zip(self.sess.get_outputs(), self.out):
            self.io.bind_output(o.name, "cpu", 0, y.dtype, list(y.shape), y.ctypes.data)

    def __call__(self):
        self.sess.run_with_iobinding(self.io)


def q(times, p):
    return float(np.percentile(np.asarray(times), p))


def time_variants(variants: dict, feeds: dict, threads: int, lib, runs: int, block: int, warmup: int) -> dict:
    runners, errors = {}, {}
    t0 = time.perf_counter()
    for name, path in variants.items():
        why = runnable(path)
        if why:
            errors[name] = why
            continue
        try:
            runners[name] = Runner(path, feeds, threads, lib if "fused" in name or "rules" in name else None)
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            log(f"  {name}: session failed: {errors[name]}")
    ref = runners["unfused"].out[0].astype(np.float64) if "unfused" in runners else None
    rel = {}
    for name, r in runners.items():
        r()
        if ref is not None and r.out[0].shape == ref.shape:
            rel[name] = float(np.linalg.norm(r.out[0].astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))
    for _ in range(warmup):
        for r in runners.values():
            r()
    times = {n: [] for n in runners}
    rounds = 0
    while min((len(t) for t in times.values()), default=runs) < runs:
        order = list(runners.items())
        if rounds % 2:
            order.reverse()  # alternate the order: no variant always follows the same one
        for name, r in order:
            r()  # untimed: the thread pool wakes up after the previous variant's session
            for _ in range(block):
                s = time.perf_counter()
                r()
                times[name].append((time.perf_counter() - s) * 1e3)
        rounds += 1
    log(f"  threads={threads}: {len(runners)} variants x {runs} runs in {time.perf_counter() - t0:.1f}s")
    res = {}
    for name in variants:
        if name in errors:
            res[name] = {"error": errors[name]}
            continue
        t = times[name]
        res[name] = {"median_ms": statistics.median(t), "p10_ms": q(t, 10), "p90_ms": q(t, 90), "runs": len(t),
                     "rel_err_vs_unfused": rel.get(name)}
    del runners
    gc.collect()
    return res


def table(title: str, res: dict) -> str:
    base = res.get("unfused", {}).get("median_ms")
    s1 = res.get("s1-all", {}).get("median_ms")
    lines = [f"### {title}", "", "| variant | median ms | p10 | p90 | unfused/variant | s1-all/variant | rel_err |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, v in res.items():
        if "error" in v:
            lines.append(f"| {name} | {v['error']} |  |  |  |  |  |")
            continue
        m = v["median_ms"]
        sp = f"{base / m:.3f}x" if base else ""
        s1r = f"{s1 / m:.3f}x" if s1 else ""
        err = v.get("rel_err_vs_unfused")
        lines.append(f"| {name} | {m:.4f} | {v['p10_ms']:.4f} | {v['p90_ms']:.4f} | {sp} | {s1r} | "
                     f"{'' if err is None else f'{err:.1e}'} |")
    return "\n".join(lines)


def host() -> dict:
    import onnxruntime as ort
    flags = ""
    try:
        txt = pathlib.Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in txt.splitlines() if ln.startswith("model name")), "")
        flags = next((ln for ln in txt.splitlines() if ln.startswith("flags")), "")
        cores = len({ln for ln in txt.splitlines() if ln.startswith("core id")})
    except OSError:
        model, cores = platform.processor(), None
    isa = sorted({f for f in flags.split() if f.startswith(("avx512", "amx", "avx2"))})
    return {"cpu": model, "cpu_count": os.cpu_count(), "core_ids": cores, "isa": isa, "onnxruntime": ort.__version__,
            "python": platform.python_version()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="llama-7b,llama")
    ap.add_argument("--size", default="quick", choices=("quick", "full"),
                    help="quick: the bench's --quick preset (tiny), full: its full-size preset (seed / llama2-7b)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens (default the case's quick / full size)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--threads", default="0,16,1,4,8", help="intra-op threads, 0 = onnxruntime's default")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--lib", default=None, help="libonnxfuse_ops.so (default ONNXFUSE_LIBRARY or the cached build)")
    ap.add_argument("--cache-dir", default="models/bench")
    ap.add_argument("--fused-skips", action="store_true", help="also fused-cpu on top of each s1-no-X")
    ap.add_argument("--only", default=None, help="comma list: time only these variants (after building all)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    h = host()
    log(f"host: {h}")
    print(f"host: {json.dumps(h)}", flush=True)
    lib = a.lib or os.environ.get("ONNXFUSE_LIBRARY")
    if lib:
        from onnxfuse import kernels
        print(f"library: {lib} cpu_gemm={kernels.build_info(lib).get('cpu_gemm')}", flush=True)
    out = {"host": h, "args": vars(a), "results": []}
    for case in a.cases.split(","):
        built = build_variants(case, a.size, a.tokens, pathlib.Path(a.cache_dir), a.fused_skips, a.layers)
        meta = built["meta"]
        print(f"\n## {case} size={a.size} tokens={meta['tokens']} shape={meta['shape']}", flush=True)
        print(f"stage 1 applied: {meta['stage1_applied']}; intermediate: {meta['stage1_intermediate']}")
        print(f"fuse --provider cpu left to onnxruntime: {json.dumps(meta['left_to_ort'])}")
        for vname, v in meta["variants"].items():
            print(f"  {vname}: {v['ops']}" + (f"  (skip {v['skip']}, applied {v['applied']})" if "skip" in v else ""))
        variants = built["variants"]
        if a.only:
            keep = a.only.split(",")
            variants = {k: v for k, v in variants.items() if k in keep or k in ("unfused", "s1-all")}
        entry = {"meta": meta, "by_threads": {}}
        for t in [int(x) for x in a.threads.split(",")]:
            res = time_variants(variants, built["feeds"], t, lib, a.runs, a.block, a.warmup)
            entry["by_threads"][str(t)] = res
            title = f"{case} size={a.size} tokens={meta['tokens']} intra_op_threads={t or 'default'}"
            print("\n" + table(title, res), flush=True)
        out["results"].append(entry)
        if a.json:
            pathlib.Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    print("\n## summary: unfused/variant (>1 = faster than unfused) per thread count")
    for entry in out["results"]:
        m = entry["meta"]
        ts = list(entry["by_threads"])
        print(f"\n{m['case']} size={m['size']} tokens={m['tokens']}")
        print("| variant | " + " | ".join(f"t={t}" for t in ts) + " |")
        print("|---|" + "---:|" * len(ts))
        for name in entry["by_threads"][ts[0]]:
            cells = []
            for t in ts:
                r = entry["by_threads"][t]
                base, v = r["unfused"].get("median_ms"), r[name].get("median_ms")
                cells.append(f"{base / v:.3f}" if base and v else "err")
            print(f"| {name} | " + " | ".join(cells) + " |")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
