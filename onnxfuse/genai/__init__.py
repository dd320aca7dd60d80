"""Real checkpoints to text through onnxruntime-genai: `export hf`, `fuse DIR`, `generate`, `verify DIR`.

onnxfuse builds on genai's engine (its model builder writes the decoder with GroupQueryAttention, packed QKV,
SkipSimplifiedLayerNormalization and the KV cache; its Generator runs it) and adds what it lacks: onnxfuse's fused
kernels in the decoder, verification against the transformers CausalLM, and one command from a checkpoint to text.

    from onnxfuse import genai
    res = genai.export_hf("SmolLM2-135M-Instruct.Q4_1.gguf", "models/smollm2")   # build + fuse
    genai.generate(res.folder, "What is the capital of France?", chat=True).text

Modules: source (checkpoint folders, GGUF, hub ids), folder (genai folders: builder, fuse, recipe), generate
(text and timings), check (verify against transformers), command (the CLI).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time

from .. import onnxio
from ..argtypes import option_key
from ..errors import OnnxfuseError
from . import folder as gf
from .check import FolderVerifyResult, verify_folder  # noqa: F401
from .generate import Generation, Sampling, generate  # noqa: F401
from .source import Source, architecture, check_folder, kind_of, resolve

DEFAULT_OUT = pathlib.Path("models")


@dataclasses.dataclass
class ExportResult:
    folder: pathlib.Path
    source: Source
    precision: str
    provider: str
    builder_seconds: float
    fuse_seconds: float | None
    fused: dict[str, int]
    left_to_onnxruntime: dict[str, str]
    op_counts: dict[str, int]
    adapters: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> its .onnx_adapter file

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["folder"], d["source"] = str(self.folder), self.source.recipe()
        return d


def default_folder(spec: str, precision: str, provider: str) -> pathlib.Path:
    name = pathlib.Path(spec.rstrip("/")).name
    name = name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
    return DEFAULT_OUT / f"{name.lower()}-{precision}-{provider}"


# The MatMulNBits accuracy_level an int4 CUDA build gets where --extra-options names none: 4, the builder's own default
# for the CPU ("X may be quantized to int8"), where its default for CUDA is 0. onnxruntime's CUDA MatMulNBits ignores
# it; onnxfuse's one-row decode GEMV then rounds X to int8 per 32 values (Int4RowGemvI8), as onnxruntime's CPU kernel
# does at that level. Measured (H200, benchmarks/results/h200-2026-12-01/int4/): SmolLM2-135M's CUDA int4 folder
# (blocks of 32, one token a step) at perplexity 20.50 on the Zen of Python against 20.32 at level 0, genai's own
# folder's 20.33 and the fp32 reference's 21.80, the same 32 greedy tokens at both levels; a Llama-2-7B-shape int4
# model decodes at 1.68-1.78 ms/token in genai's CUDA graph against 1.83-1.94 at level 0 (three runs). accuracy_level=0
# in --extra-options keeps X in fp16.
CUDA_INT4_ACCURACY_LEVEL = 4


def builder_options(precision: str, provider: str, extra_options: list[str] | None) -> list[str]:
    """The builder's --extra_options for a build: the user's, and for an int4 CUDA build that names no
    accuracy_level, accuracy_level=CUDA_INT4_ACCURACY_LEVEL."""
    options = list(extra_options or [])
    if precision == "int4" and provider == "cuda" and not any(option_key(o) == "accuracy_level" for o in options):
        options.append(f"accuracy_level={CUDA_INT4_ACCURACY_LEVEL}")
    return options


def export_hf(spec: str, out: str | pathlib.Path | None = None, *, precision: str = "fp32", provider: str = "cpu",
              fuse: bool = True, force: bool = False, extra_options: list[str] | None = None,
              trust_remote_code: bool = False, allow_pickle: bool = False, cpu_isa: str | None = None,
              adapters: list[str] | None = None, progress=None) -> ExportResult:
    """Checkpoint `spec` (transformers folder, .gguf, hub id) -> genai folder `out` through genai's model builder,
    then fused (`fuse`): the folder's decoder is the fused one and its config names the kernel library. `adapters`
    (`[NAME=]PEFT_DIR` each): the decoder takes their LoRA weights as inputs (zero defaults: the base model) and
    each adapter is written to `<NAME>.onnx_adapter` in the folder (genai/adapter.py). Nothing is left at `out` when
    a step fails."""
    say = progress or (lambda *_: None)  # _term.Progress: (index, total, stage, detail)
    total = 3 if fuse else 2
    if precision not in gf.PRECISIONS:
        raise OnnxfuseError(f"--dtype must be one of {', '.join(gf.PRECISIONS)} (got {precision!r})")
    if provider not in ("cpu", "cuda"):
        raise OnnxfuseError(f"--provider must be cpu or cuda (got {provider!r})")
    kind_of(spec)  # a bad SOURCE fails before anything is written
    from . import adapter as ga
    peft_dirs = ga.parse(adapters or [], allow_pickle=allow_pickle)
    if peft_dirs and precision == "bf16":
        raise OnnxfuseError("--adapter with --dtype bf16: an adapter file is written from numpy, which has no "
                            "bfloat16; export with --dtype fp16 or fp32")
    out = pathlib.Path(out) if out is not None else default_folder(spec, precision, provider)
    extra_options = builder_options(precision, provider, extra_options)
    supported = gf.supported_architectures()
    if provider == "cuda":
        from .generate import genai
        genai("cuda")
    with gf.staged(out, force) as tmp:
        work = tmp / ".work"
        work.mkdir()
        say(1, total, "source", f"reading {spec}")
        source = resolve(spec, work, trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
        hf_config = check_folder(source.folder, allow_pickle=True)
        arch = architecture(hf_config)
        if arch not in supported:
            raise OnnxfuseError(f"{spec}: architecture {arch} is not one genai's model builder has; it has "
                                f"{', '.join(a for a in supported if a.endswith('ForCausalLM'))} (and multimodal ones)")
        built = work / "built" if fuse else tmp
        built.mkdir(exist_ok=True)
        say(2, total, "build", f"genai model builder ({precision}, {provider})")
        first = [f"adapter_path={next(iter(peft_dirs.values()))}"] if peft_dirs else []
        seconds = gf.run_builder(source.folder, built, precision, provider, work / "cache",
                                 [*(extra_options or []), *first], work / "builder.log",
                                 trust_remote_code=trust_remote_code)
        params = _adapter_weights(peft_dirs, built, source.folder, precision, provider, work,
                                  extra_options or [], trust_remote_code, say, total)
        recipe = {"source": source.recipe(), "precision": precision, "provider": provider,
                  "extra_options": list(extra_options or []), "architecture": arch,
                  "adapters": {name: name + ga.EXTENSION for name in peft_dirs}}
        fuse_seconds, left = None, {}
        if fuse:
            say(3, total, "fuse", f"onnxfuse rules on the decoder (for {provider})")
            t0 = time.perf_counter()
            res = gf.fuse_folder(built, tmp, provider=provider, cpu_isa=cpu_isa, recipe=recipe)
            fuse_seconds, left = time.perf_counter() - t0, dict(res.left_to_ort)
        else:
            gf.write_recipe(tmp, {**recipe, "fused": {}})
        from ..adapters import write_adapter
        for name, values in params.items():
            write_adapter(tmp / (name + ga.EXTENSION), values)
        import shutil
        shutil.rmtree(work)
        counts = gf.op_counts(gf.decoder_path(tmp))
    fused = {op: n for op, n in counts.items() if op.startswith("onnxfuse::")}
    return ExportResult(out, source, precision, provider, seconds, fuse_seconds, fused, left, counts,
                        {name: str(out / (name + ga.EXTENSION)) for name in params})


def _adapter_weights(peft_dirs: dict, built: pathlib.Path, hf_folder: pathlib.Path, precision: str, provider: str,
                     work: pathlib.Path, extra_options: list[str], trust_remote_code: bool, say, total: int) -> dict:
    """{adapter name: its weights (input name -> array)}: the first adapter's, lifted out of the decoder the builder
    wrote with it (now inputs with zero defaults); every other one's from a build of its own in a scratch folder."""
    from . import adapter as ga
    if not peft_dirs:
        return {}
    names = list(peft_dirs)
    params = {names[0]: ga.lift(gf.decoder_path(built))}
    for i, name in enumerate(names[1:], 1):
        say(2, total, "build", f"adapter {name} ({i + 1} of {len(names)}) through genai's model builder")
        scratch = work / f"adapter-{i}"
        scratch.mkdir()
        gf.run_builder(hf_folder, scratch, precision, provider, work / "cache",
                       [*extra_options, f"adapter_path={peft_dirs[name]}"], work / f"builder-adapter-{i}.log",
                       trust_remote_code=trust_remote_code)
        other = ga.weights(gf.decoder_path(scratch))
        ga.check_same_layout(names[0], params[names[0]], name, other)
        params[name] = other
    return params


def fuse_dir(src: str | pathlib.Path, out: str | pathlib.Path | None = None, *, provider: str | None = None,
             cpu_isa: str | None = None, patterns: list[str] | None = None, force: bool = False,
             explain: bool = False, report_path: str | pathlib.Path | None = None):
    """Fuse genai folder `src` into a new folder `out` (default `<src>-fused`); `explain`, `report_path` as fuse's.
    Returns (out, FuseResult)."""
    src = pathlib.Path(src)
    gf.read_config(src)
    out = pathlib.Path(out) if out is not None else src.with_name(src.name + "-fused")
    if out.resolve() == src.resolve():
        raise OnnxfuseError(f"{out}: is the input folder; give another folder with -o")
    if report_path is not None:
        onnxio.check_output_path(report_path, force=True)
    with gf.staged(out, force) as tmp:
        res = gf.fuse_folder(src, tmp, provider=provider, cpu_isa=cpu_isa, patterns=patterns, explain=explain)
    if report_path is not None:  # once the folder is in place: a fuse that fails leaves neither
        onnxio.write_atomic(report_path, json.dumps(res.report(), indent=2))
    return out, res
