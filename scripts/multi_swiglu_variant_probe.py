"""multi_lora_swiglu's epilogue variants on the GPU, by Triton's JIT, against onnxfuse.schema's reference: the doctor's
MultiLoRASwiGLU shapes in each dtype with the build's tiles (aot.specialisations, sm_90), for the library's kernel and
for source edits of it (VARIANTS: text replacements of swiglu.py, loaded as a private package beside gemm_loop.py).
Needs torch and triton only (the device's /opt/torch/.venv):

    python3 scripts/multi_swiglu_variant_probe.py [--entries 3] [--dtypes float] [--seeds 0,2] [--variants library]

--aot: each variant compiled as the library build compiles it (aot.compile_one: its alignment hints, PDL, no line
info) and that binary launched, instead of Triton's JIT; --splits: phase 1's K slices (the launcher plans its own).
(--entries: indices into MultiLoRASwiGLU's doctor_shapes, default the first six; --seeds: make_doctor_inputs' seeds,
the doctor's is 0.)
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import pathlib
import sys
import tempfile

import torch
import triton

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from onnxfuse import schema  # noqa: E402

SRC = ROOT / "onnxfuse/kernels/triton"
HOIST = "    if NA <= 128 // R_PAD:\n"
VARIANTS = {
    "library": [],
    "chunk-loop": [(HOIST, "    if NA < 0:  # never: the chunk loop\n")],
    # the form first committed (0938c59): an `if` around the one-chunk dots, wrong in fp32 in the sm_90 build
    "branch": [("        gate = tl.where(used, _multi_chunk(gate, aid, tgt, bgc, sg_ptr, 0, NA, BLOCK_M, R_PAD, "
                "DOT_PRECISION), gate)\n        up = tl.where(used, _multi_chunk(up, aid, tut, buc, su_ptr, 0, NA, "
                "BLOCK_M, R_PAD, DOT_PRECISION), up)\n",
                "        if used:\n            gate = _multi_chunk(gate, aid, tgt, bgc, sg_ptr, 0, NA, BLOCK_M, R_PAD, "
                "DOT_PRECISION)\n            up = _multi_chunk(up, aid, tut, buc, su_ptr, 0, NA, BLOCK_M, R_PAD, "
                "DOT_PRECISION)\n")],
}
TT = {"float": torch.float32, "float16": torch.float16}


def load_variant(name, edits, tmp):
    d = pathlib.Path(tmp) / name
    d.mkdir()
    for f in SRC.glob("*.py"):
        text = f.read_text()
        if f.name == "swiglu.py":
            for old, new in edits:
                assert text.count(old) == 1, (name, old)
                text = text.replace(old, new)
        (d / f.name).write_text(text)
    pkg_name = "_kv_" + name.replace("-", "_")
    pkg = importlib.util.module_from_spec(importlib.util.spec_from_loader(pkg_name, loader=None, is_package=True))
    pkg.__path__ = [str(d)]
    sys.modules[pkg_name] = pkg
    return importlib.import_module(pkg_name + ".swiglu"), importlib.import_module(pkg_name + ".lora_linear")


def build_spec(dtype, size, rpad, aligned):
    """aot.py's sm_90 specialisation of multi_lora_swiglu (its tile config among it), as the library build takes it."""
    from onnxfuse.kernels.triton import aot
    specs = aot.specialisations(["90"], aot.default_overrides(None))
    return next(s for s in specs if s["kernel"] == "multi_lora_swiglu"
                and s["dtype"] == {"float": "fp32", "float16": "fp16"}[dtype] and s["size"] == size
                and s["r_pad"] == rpad and s["aligned"] == aligned)


def aot_kernel(sw, spec):
    """``(compiled, source)``: the variant's multi_lora_swiglu as aot.compile_one builds `spec`."""
    from onnxfuse.kernels.triton import aot
    cap = {}
    orig_compile, orig_load = triton.compile, aot._load_kernels
    params = orig_load()["multi_lora_swiglu"][1]

    def compile_(src, *a, **k):
        cap["src"] = src
        cap["c"] = orig_compile(src, *a, **k)
        return cap["c"]
    triton.compile, aot._load_kernels = compile_, lambda: {"multi_lora_swiglu": (sw._multi_lora_swiglu_kernel, params)}
    try:
        aot.compile_one(spec)
    finally:
        triton.compile, aot._load_kernels = orig_compile, orig_load
    return cap["c"], cap["src"]


def size_class(m):
    return "small" if m <= 16 else "medium" if m <= 128 else "large"


def run_case(sop, mods, entry, dtype, seed, splits, use_aot):
    """One doctor entry in one dtype: each variant's max error against the reference (NaN where both are NaN
    counts as equal), per phase-1 split."""
    t = TT[dtype]
    prec = "ieee" if dtype == "float" else "tf32"
    shapes, attrs, _ = sop.doctor_entry(entry)
    ins = [v.cuda() if torch.is_tensor(v) else v for v in sop.make_doctor_inputs(t, shapes, seed=seed)]
    x, wg, wu, ag, bg, au, bu, sg, su, idx = ins
    ref = schema.reference("MultiLoRASwiGLU", [v.cpu() for v in ins], attrs)
    na, m, k, n = entry[6], x.numel() // x.shape[-1], x.shape[-1], wg.shape[1]
    rpi = m // x.shape[0]
    rpad = next(p for p in (16, 32, 64) if max(entry[4], entry[5]) <= p)
    x2 = x.reshape(m, k)
    ref = ref.reshape(m, n).float()
    aligned = int(k % 16 == 0 and n % 16 == 0 and entry[4] % 8 == 0 and entry[5] % 8 == 0)
    spec = build_spec(dtype, size_class(m), rpad, aligned)
    bm, bn, bk, gm, warps, stages = spec["config"]
    line = []
    for name, (sw, lora) in mods.items():
        for split in splits:
            kb = triton.cdiv(triton.cdiv(k, 16), split)
            tg = torch.full((split, m, rpad), float("nan"), device="cuda")
            tu = torch.full((split, m, rpad), float("nan"), device="cuda")
            lora._multi_lora_xa_kernel[(triton.cdiv(m, 16) * split * na,)](
                x2, ag, au, idx, tg, tu, m, k, entry[4], entry[5], 2, na, rpi, kb, tg, 0, BLOCK_M=16, BLOCK_K=16,
                R_PAD=rpad, DOT_PRECISION=prec)
            y = torch.full((m, n), float("nan"), device="cuda").to(t)
            code = schema.GATE_ACTIVATIONS.index(entry[7])
            kargs = [x2, wg, wu, tg, bg, sg, tu, bu, su, idx, y, m, n, k, entry[4], entry[5], na, rpi, split, code,
                     bg, tg, 0]  # (the launcher passes B_gate as ad where RD is 0)
            if use_aot:
                compiled, src = aot_kernel(sw, spec)
                # the signature: the kernel's parameters, then its constexprs (which the launcher skips)
                compiled[(triton.cdiv(m, bm) * triton.cdiv(n, bn), 1, 1)](
                    *(kargs + [None] * (len(src.signature) - len(kargs))))
            else:
                sw._multi_lora_swiglu_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](
                    *kargs, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, R_PAD=rpad, DOT_PRECISION=prec,
                    num_warps=warps, num_stages=stages)
            torch.cuda.synchronize()
            got = y.float().cpu()
            err = torch.where(torch.isnan(got) & torch.isnan(ref), 0.0, (got - ref).abs()).nan_to_num(1e9)
            line.append(f"{name} split {split} {float(err.max()):.3g}")
    print(entry, dtype, size_class(m), "index", idx.tolist(), "max err:", ", ".join(line), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", default="0,1,2,3,4,5")
    p.add_argument("--dtypes", default="float,float16")
    p.add_argument("--seeds", default="0")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--aot", action="store_true")
    p.add_argument("--splits", default="2")
    args = p.parse_args()
    sop = schema.op_def("MultiLoRASwiGLU")
    splits = [int(s) for s in args.splits.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        mods = {name: load_variant(name, VARIANTS[name], tmp) for name in args.variants.split(",")}
        for i in args.entries.split(","):
            entry = sop.doctor_shapes[int(i)]
            if entry[0] * entry[1] == 1:  # the JIT would make M = 1 a constant (the AOT build does not)
                continue
            for dtype in args.dtypes.split(","):
                for seed in args.seeds.split(","):
                    run_case(sop, mods, entry, dtype, int(seed), splits, args.aot)


if __name__ == "__main__":
    main()
