"""Where a checkpoint comes from: a transformers folder, a GGUF file, or a hub id; and the CausalLM it holds.

Untrusted files run no code of their own: transformers loads with trust_remote_code only when the user passes
--trust-remote-code, weights come from safetensors (a folder of pickles only with --allow-pickle), and a GGUF is
dequantized by transformers' own loader (the `gguf` package), never by code named in its metadata.

A GGUF checkpoint becomes a transformers folder (safetensors, config, tokenizer) in the caller's work folder: the
builder reads folders, and the model transformers loads from a GGUF carries a quantization config that
save_pretrained refuses, so the class is rebuilt from the config and given the loaded state dict.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re

from ..errors import OnnxfuseError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
WEIGHT_GLOBS = ("*.safetensors",)
PICKLE_GLOBS = ("*.bin", "*.pt", "*.pth")


@dataclasses.dataclass
class Source:
    """What `export hf` read: `spec` as the user gave it, its `kind` (folder, gguf, hub), and `folder`, a
    transformers folder holding it (the GGUF's conversion; the hub's download)."""
    spec: str
    kind: str
    folder: pathlib.Path | None
    gguf_file: str | None = None
    trust_remote_code: bool = False

    def recipe(self) -> dict:
        return {"source": self.spec, "kind": self.kind, "gguf_file": self.gguf_file,
                "trust_remote_code": self.trust_remote_code}


def kind_of(spec: str) -> str:
    p = pathlib.Path(spec).expanduser()
    if p.is_dir():
        return "folder"
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise OnnxfuseError(f"{spec}: a file that is not a .gguf; give a transformers checkpoint folder (with "
                                "config.json), a .gguf file, or a hub id like HuggingFaceTB/SmolLM2-135M-Instruct")
        return "gguf"
    if HUB_ID.match(spec):
        return "hub"
    raise OnnxfuseError(f"{spec}: no such folder or file, and not a hub id; give a transformers checkpoint folder "
                        "(with config.json), a .gguf file, or a hub id like HuggingFaceTB/SmolLM2-135M-Instruct")


def resolve(spec: str, work: pathlib.Path, trust_remote_code: bool = False, allow_pickle: bool = False,
            convert: bool = True) -> Source:
    """The transformers folder of `spec` (converted or downloaded into `work` when it is not one already; a GGUF
    only when `convert`, which the builder needs and the reference module does not)."""
    kind = kind_of(spec)
    if kind == "folder":
        folder = pathlib.Path(spec).expanduser().resolve()
        check_folder(folder, allow_pickle)
        return Source(str(folder), kind, folder, trust_remote_code=trust_remote_code)
    if kind == "gguf":
        path = pathlib.Path(spec).expanduser().resolve()
        if not convert:  # transformers reads the GGUF itself (verify): no copy written
            return Source(str(path), kind, None, gguf_file=str(path))
        folder = work / "checkpoint"
        gguf_to_folder(path, folder)
        return Source(str(path), kind, folder, gguf_file=str(path))
    folder = work / "checkpoint"
    download(spec, folder)
    check_folder(folder, allow_pickle)
    return Source(spec, kind, folder, trust_remote_code=trust_remote_code)


def check_folder(folder: pathlib.Path, allow_pickle: bool = False) -> dict:
    """config.json of a transformers checkpoint folder with safetensors weights (pickles only when allowed)."""
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise OnnxfuseError(f"{folder}: no config.json; give a transformers checkpoint folder (save_pretrained writes "
                            "one) or a .gguf file")
    try:
        config = json.loads(cfg.read_text())
    except (OSError, ValueError) as e:
        raise OnnxfuseError(f"{cfg}: not readable JSON ({e}); re-save the checkpoint with save_pretrained") from None
    has = lambda globs: any(next(folder.glob(g), None) is not None for g in globs)  # noqa: E731
    if not has(WEIGHT_GLOBS):
        if has(PICKLE_GLOBS) and not allow_pickle:
            raise OnnxfuseError(f"{folder}: weights only as pickles (.bin/.pt), which can run code when loaded; "
                                "re-save them as safetensors (save_pretrained(safe_serialization=True)) or pass "
                                "--allow-pickle if you trust the file")
        if not has(PICKLE_GLOBS):
            raise OnnxfuseError(f"{folder}: no weights (*.safetensors); give a complete checkpoint folder")
    return config


def architecture(config: dict) -> str:
    archs = config.get("architectures") or []
    if not archs:
        raise OnnxfuseError("the checkpoint's config.json names no architecture ('architectures': "
                            "['LlamaForCausalLM'], say); re-save it with a CausalLM class's save_pretrained")
    return archs[0]


def load_config(source: Source):
    import transformers
    return transformers.AutoConfig.from_pretrained(str(source.folder), trust_remote_code=source.trust_remote_code)


def load_causal_lm(source: Source, dtype=None):
    """The transformers CausalLM of `source` in eval mode (its converted folder for a GGUF: the same weights)."""
    import torch
    import transformers
    kwargs = {"trust_remote_code": source.trust_remote_code, "dtype": dtype or torch.float32}
    quiet_transformers()
    if source.folder is None:  # a GGUF, dequantized by transformers' loader
        path = pathlib.Path(source.gguf_file)
        kwargs["gguf_file"] = path.name
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), **kwargs)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(source.folder), **kwargs)
    return model.eval()


def quiet_transformers() -> None:
    """transformers' progress bars and advice on stderr would interleave with the streamed text and the tables."""
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def load_tokenizer(folder: pathlib.Path, trust_remote_code: bool = False):
    import transformers
    quiet_transformers()
    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise OnnxfuseError(f"{folder}: no tokenizer transformers can load ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:200] if str(e) else ''}); the folder needs tokenizer.json "
                            "or the tokenizer files save_pretrained writes") from None


def gguf_to_folder(path: pathlib.Path, folder: pathlib.Path) -> None:
    """Dequantize a GGUF through transformers' loader and save it as a safetensors folder with its tokenizer."""
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError:
        raise OnnxfuseError("reading a .gguf needs the gguf package: pip install 'onnxfuse[genai]'") from None
    import torch
    import transformers
    quiet_transformers()
    kw = {"gguf_file": path.name}
    try:
        config = transformers.AutoConfig.from_pretrained(str(path.parent), **kw)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), **kw)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kw)
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as e:
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise OnnxfuseError(f"{path}: transformers cannot read this GGUF ({first}); convert it to a transformers "
                            "folder, or use a GGUF of an architecture and quantization type transformers reads "
                            "(F32, F16, BF16, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0)") from None
    # transformers keeps the GGUF's quantization config on the loaded model; a fresh model of the same class takes
    # the dequantized weights and saves cleanly
    for attr in ("quantization_config", "_pre_quantization_dtype"):  # the builder reads any it finds
        if attr in config.__dict__:
            delattr(config, attr)
    model = type(loaded)(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [m for m in missing if not m.endswith("lm_head.weight")]:
        raise OnnxfuseError(f"{path}: the dequantized weights do not fit {type(loaded).__name__} (missing "
                            f"{missing[:3]}, unexpected {unexpected[:3]}); convert the GGUF to a transformers folder")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))


def download(repo_id: str, folder: pathlib.Path) -> None:
    """A hub checkpoint's config, tokenizer and safetensors weights (no pickles, no code files)."""
    try:
        import huggingface_hub
        huggingface_hub.snapshot_download(repo_id, local_dir=str(folder),
                                          allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    except Exception as e:
        raise OnnxfuseError(f"{repo_id}: could not download it from the hub ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:160] if str(e) else ''}); on a machine without the hub give "
                            "a local checkpoint folder or .gguf file") from None
