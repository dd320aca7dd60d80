"""onnxruntime-genai model folders: made by genai's model builder, fused in place of their decoder, run by genai.

A folder holds `genai_config.json` (the decoder's file name, its session options, the search defaults), the decoder
`model.onnx` (+ its weights file) and tokenizer files. A fused folder also holds the kernel library as
`libonnxfuse_ops.so` beside the model (genai loads a custom-op library only by a path inside allowed folders, so
the config names the file, not a path elsewhere) and `onnxfuse.json`, the recipe: where the checkpoint came from
(so `verify` can rebuild the transformers module), the builder's precision and execution provider, and what fused.

Every folder is written next to its destination under a temporary name and renamed into place when complete: an
interrupted or failed export or fuse leaves no half-written folder.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

from .. import __version__, onnxio
from ..errors import OnnxfuseError
from ..ops.int4_linear import SKIP_RMS_NORM_INT4_LINEAR, SKIP_RMS_NORM_INT4_SWIGLU
from ..ops.linear import LINEAR_SKIP_RMS_NORM
from ..schema import DOMAIN

CONFIG = "genai_config.json"
RECIPE = "onnxfuse.json"
LIBRARY = "libonnxfuse_ops.so"
PRECISIONS = ("fp32", "fp16", "bf16", "int4")
# What the builder writes that onnxfuse must leave as it found it: onnxruntime's contrib ops (attention with the KV
# cache, the norms, rotary, quantized GEMMs). fuse_folder fails rather than write a folder that lost one.
KEPT_DOMAINS = ("com.microsoft",)
# The contrib ops onnxfuse's rules replace, by the onnxfuse ops that take their place and how many of one each takes
# (rewrites/int4_linear.py: Int4Linear one MatMulNBits, Int4SwiGLU the gate's and the up projection's;
# SkipRMSNormInt4Linear and SkipRMSNormInt4SwiGLU one SkipSimplifiedLayerNormalization and the projection's;
# rewrites/cached_attention.py: CachedAttention one GroupQueryAttention; rewrites/linear.py: LinearSkipRMSNorm one
# SkipSimplifiedLayerNormalization): a count may drop by what those ops' counts say, and nothing else.
_NORM_INT4 = f"{DOMAIN}::{SKIP_RMS_NORM_INT4_LINEAR.name}"
_NORM_INT4_SWIGLU = f"{DOMAIN}::{SKIP_RMS_NORM_INT4_SWIGLU.name}"
REPLACED_BY = {"com.microsoft::MatMulNBits": {f"{DOMAIN}::Int4Linear": 1, f"{DOMAIN}::Int4SwiGLU": 2, _NORM_INT4: 1,
                                              _NORM_INT4_SWIGLU: 2},
               "com.microsoft::GroupQueryAttention": {f"{DOMAIN}::CachedAttention": 1},
               "com.microsoft::SkipSimplifiedLayerNormalization": {f"{DOMAIN}::{LINEAR_SKIP_RMS_NORM.name}": 1,
                                                                   _NORM_INT4: 1, _NORM_INT4_SWIGLU: 1}}


# ------------------------------------------------------------------------------------------------ reading
def is_folder(path: str | os.PathLike) -> bool:
    return pathlib.Path(path).is_dir()


def read_config(folder: pathlib.Path) -> dict:
    cfg = folder / CONFIG
    if not cfg.is_file():
        raise OnnxfuseError(f"{folder}: is a directory with no {CONFIG}; give an .onnx model file or an "
                            "onnxruntime-genai model folder (made by 'onnxfuse export hf' or python -m "
                            "onnxruntime_genai.models.builder)")
    try:
        config = json.loads(cfg.read_text())
        config["model"]["decoder"]["filename"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OnnxfuseError(f"{cfg}: not a genai config with model.decoder.filename ({type(e).__name__}: {e}); "
                            "rebuild the folder with the model builder") from None
    return config


def decoder_path(folder: pathlib.Path, config: dict | None = None) -> pathlib.Path:
    config = config or read_config(folder)
    name = config["model"]["decoder"]["filename"]
    path = (folder / name).resolve()
    if folder.resolve() not in path.parents or not path.is_file():
        raise OnnxfuseError(f"{folder}: the decoder {name!r} named in {CONFIG} is not a file inside the folder; "
                            "rebuild the folder with the model builder")
    return path


def read_recipe(folder: pathlib.Path) -> dict | None:
    path = folder / RECIPE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise OnnxfuseError(f"{path}: not readable JSON; remove it, or rebuild the folder with 'onnxfuse export hf'") \
            from None


def graph(model_path: pathlib.Path):
    """The decoder's ModelProto without its weights (a graph-only read, also for a 13 GB decoder)."""
    import onnx
    return onnx.load(str(model_path), load_external_data=False)


def op_counts(model_path: pathlib.Path) -> dict[str, int]:
    """Node counts of the decoder by 'domain::op' (the default domain without a prefix): onnxio.op_counts."""
    return onnxio.op_counts(graph(model_path))


def provider_of(config: dict) -> str:
    """The execution provider the folder was built for ("cuda" or "cpu"), from its decoder's provider options."""
    options = config["model"]["decoder"].get("session_options", {}).get("provider_options", [])
    return "cuda" if any("cuda" in o for o in options if isinstance(o, dict)) else "cpu"


# ------------------------------------------------------------------------------------------------ writing
@contextlib.contextmanager
def staged(out: pathlib.Path, force: bool):
    """A temporary folder beside `out`, renamed to `out` when the block completes (removed when it fails)."""
    if out.exists() and not force:
        raise OnnxfuseError(f"{out}: already exists; pass --force to replace it or choose another folder with -o")
    if out.exists() and not out.is_dir():
        raise OnnxfuseError(f"{out}: exists and is not a folder; choose another path with -o")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # a folder like any other, not mkdtemp's owner-only one
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def supported_architectures() -> list[str]:
    """The architectures genai's model builder has a model class for (read from its source: importing it is slow)."""
    import importlib.util
    spec = importlib.util.find_spec("onnxruntime_genai.models.builder")
    if spec is None or spec.origin is None:
        raise OnnxfuseError("onnxruntime-genai is not installed: pip install 'onnxfuse[genai]' (CPU) or "
                            "onnxruntime-genai-cuda (GPU)")
    text = pathlib.Path(spec.origin).read_text()
    return sorted(set(re.findall(r'config\.architectures\[0\] == "(\w+)"', text)))


def run_builder(hf_folder: pathlib.Path, out: pathlib.Path, precision: str, provider: str, cache: pathlib.Path,
                extra_options: list[str], log_path: pathlib.Path, trust_remote_code: bool = False) -> float:
    """genai's model builder on a transformers folder into `out`; its output goes to `log_path`. Returns seconds."""
    extra = list(extra_options)
    if trust_remote_code:
        extra.append("hf_remote=true")
    # the builder's own CLI behind onnxfuse's adaptation of Gemma 3's config to it (genai/_builder.py)
    cmd = [sys.executable, "-m", "onnxfuse.genai._builder", "-i", str(hf_folder), "-o", str(out),
           "-p", precision, "-e", provider, "-c", str(cache)] + (["--extra_options", *extra] if extra else [])
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0 or not (out / CONFIG).is_file():
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-1:] or ["no output"]
        kept = _keep_log(log_path, hf_folder.name)  # the work folder goes with the failed output
        raise OnnxfuseError(f"genai's model builder failed ({tail[0][:240]}); its log: {kept}")
    return time.perf_counter() - t0


def _keep_log(log: pathlib.Path, name: str) -> pathlib.Path:
    from ..kernels.cache import build_dir
    logs = build_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    kept = logs / f"genai-builder-{name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    shutil.copy2(log, kept)
    return kept



def fuse_folder(src: pathlib.Path, out: pathlib.Path, *, provider: str | None = None, cpu_isa: str | None = None,
                patterns: list[str] | None = None, recipe: dict | None = None, library: pathlib.Path | None = None,
                explain: bool = False):
    """Fuse the decoder of genai folder `src` into folder `out` (a new folder; every other file copied): the
    fused model under the decoder's name, the kernel library beside it and named in the config's session options
    when an onnxfuse node was written, and the recipe. `explain`: fuse's (the candidates that did not fuse and why).
    Returns the FuseResult."""
    from .. import fuse as fuse_mod
    from .. import kernels
    config = read_config(src)
    model = decoder_path(src, config)
    provider = provider or provider_of(config)
    source = graph(model)
    data_files = _data_files(source)
    for item in src.iterdir():  # everything but the decoder and its weights, which fuse writes anew
        if item.name in (model.name, *data_files, RECIPE, LIBRARY) or item.name.startswith("."):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, out / item.name)
    before = onnxio.op_counts(source)
    del source
    # Stage 1 (onnxruntime's fusions) is off: the builder already wrote them, and its graph is left as it is.
    res = fuse_mod.fuse(model, out / model.name, patterns=patterns, provider=provider,
                        cpu_isa=cpu_isa if provider == "cpu" else None, ort=False, write_unchanged=True,
                        explain=explain)
    after = op_counts(out / model.name)
    def kept(op: str) -> int:  # the op's count after fusing, what its replacements took counted as kept
        return after.get(op, 0) + sum(each * (after.get(new, 0) - before.get(new, 0))
                                      for new, each in REPLACED_BY.get(op, {}).items())

    lost = {op: (n, after.get(op, 0)) for op, n in before.items()
            if op.split("::")[0] in KEPT_DOMAINS and kept(op) != n}
    if lost:
        raise OnnxfuseError(f"fusing would change the builder's own ops ({lost}); nothing written: report this as a "
                            "bug with the folder's genai_config.json")
    fused = {op: n for op, n in after.items() if op.startswith(DOMAIN + "::")}
    decoder = config["model"]["decoder"].setdefault("session_options", {})
    if fused:
        shutil.copy2(library or kernels.library_path(provider=provider), out / LIBRARY)
        decoder["custom_ops_library"] = LIBRARY
    else:
        decoder.pop("custom_ops_library", None)
    (out / CONFIG).write_text(json.dumps(config, indent=4) + "\n")
    full = dict(recipe or read_recipe(src) or {})
    full.update({"onnxfuse": __version__, "fused": fused, "left_to_onnxruntime": res.left_to_ort,
                 "fused_for": provider, "unfused_op_counts": before})
    write_recipe(out, full)
    return res


def write_recipe(folder: pathlib.Path, recipe: dict) -> None:
    (folder / RECIPE).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")


def _data_files(m) -> set[str]:
    """The external-data files the decoder's initializers name (`m`: its graph, folder.graph)."""
    names = set()
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                names.add(pathlib.Path(e.value).name)
    return names
