"""Export the zoo's PyTorch modules to ONNX with a recipe that rebuilds the module bit-identically.

    from onnxfuse import export, zoo
    res = export.export("llama", zoo.LlamaSpec.from_preset("tiny"), "models/llama-tiny.onnx")
    res.path, res.data_path, res.op_counts

`onnxfuse.export(...)` is the same function. The recipe (JSON in the model's ``metadata_props`` under
``onnxfuse.recipe``) holds the kind, the full config, the seed, the dtype, the input spec and the versions that
made it; ``onnxfuse verify`` rebuilds the module from it.
"""
from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import os
import pathlib
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import onnx
import torch

from . import __version__, adapters, onnxio, zoo
from .onnxio import op_counts  # noqa: F401  (export.op_counts: the public name)
from .errors import OnnxfuseError
from .schema import IR_VERSION, ONNX_OPSET

RECIPE_KEY = "onnxfuse.recipe"
# torch.onnx logs a warning per missing torchvision op at every export: noise for onnxfuse's users.
logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
EXPORTERS = ("auto", "dynamo", "torchscript")


@dataclass
class ExportResult:
    """What `export` wrote: the model `path`, its weights file `data_path` (`<path>.data`, or None when the weights
    are inside the .onnx), the torch exporter used ("dynamo" or "torchscript"), the seconds taken, node counts per op
    type (`op_counts`, see `op_counts`), the recipe stored in the model, and `warnings` (e.g. the fallback from the
    dynamo exporter to TorchScript, also issued as Python warnings)."""
    path: pathlib.Path
    exporter: str
    seconds: float
    op_counts: dict[str, int]
    recipe: dict
    warnings: list[str] = field(default_factory=list)
    data_path: pathlib.Path | None = None
    # --lora-as-inputs: the exported adapter's weights (onnxruntime adapter format, `<path>_adapter`), else None
    adapter_path: pathlib.Path | None = None


def output_names(kind: str, spec) -> list[str]:
    """The graph output names of an exported `kind` ("llama": y for --mlp-only, else last_hidden_state; "dlrm":
    probability)."""
    if kind == "llama":
        return ["y"] if spec.mlp_only else ["last_hidden_state"]
    return ["pred"] if kind in zoo.DLRM_UPSTREAM_KINDS else ["probability"]


# facebookresearch/dlrm's --save-onnx: TorchScript at opset 11 (fuse upgrades it), with its dynamic axes.
UPSTREAM_OPSET = 11


def _dynamic(kind: str, spec, names: list[str]):
    """Symbolic batch (and sequence) dims, for both exporters; the upstream DLRM's are its repository's."""
    if kind == "llama":
        return {n: {0: "batch", 1: "sequence"} for n in names}
    if kind in zoo.DLRM_UPSTREAM_KINDS:
        from . import upstream_dlrm
        return upstream_dlrm.dynamic_axes(len(spec.table_sizes) if kind == "dlrm-upstream-tables" else None)
    return {n: {0: "batch"} for n in names}


def _versions() -> dict:
    import transformers
    out = {"onnxfuse": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
           "onnx": onnx.__version__}
    try:
        import peft
        out["peft"] = peft.__version__
    except ImportError:
        pass
    return out


def make_recipe(kind: str, spec, seed: int, dtype: str, inputs: dict[str, torch.Tensor], exporter: str,
                dynamic: bool) -> dict:
    """The recipe stored in the model's metadata: kind, full spec, seed, dtype, inputs, outputs and versions."""
    return {
        "kind": kind, "spec": zoo.spec_to_dict(spec), "seed": seed, "dtype": dtype,
        "inputs": [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                   for n, t in inputs.items()],
        "outputs": output_names(kind, spec), "dynamic": dynamic, "exporter": exporter, "versions": _versions(),
    }


def read_recipe(model: onnx.ModelProto) -> dict | None:
    """The recipe `export` stored in `model` (a dict, see make_recipe), or None for a model it did not write."""
    raw = onnxio.get_metadata(model, RECIPE_KEY)
    return json.loads(raw) if raw else None


STAGES = ("module", "export", "write", "external data")


def _check_request(spec, out, dtype: str, exporter: str, force: bool, lora_as_inputs: bool,
                   multi_adapters: int = 0) -> tuple[pathlib.Path, pathlib.Path | None]:
    """export()'s arguments checked before any work: (the output path, the adapter file's path or None)."""
    if dtype not in zoo.DTYPES:
        raise OnnxfuseError(f"--dtype must be one of {', '.join(zoo.DTYPES)} (got {dtype!r})")
    if exporter not in EXPORTERS:
        raise OnnxfuseError(f"--exporter must be one of {', '.join(EXPORTERS)} (got {exporter!r})")
    spec.validate()
    if multi_adapters and not lora_as_inputs:
        raise OnnxfuseError("multi_adapters (--adapters N) needs lora_as_inputs: the stacks are the adapters' inputs")
    if multi_adapters < 0:
        raise OnnxfuseError(f"--adapters must be >= 1 (got {multi_adapters})")
    if lora_as_inputs and not getattr(spec, "lora_rank", 0):
        raise OnnxfuseError("--lora-as-inputs needs LoRA adapters to export: add --lora-rank R")
    if lora_as_inputs and dtype == "bf16":
        raise OnnxfuseError("--lora-as-inputs: onnxruntime's adapter files hold no bf16 from Python; export fp32 or "
                            "fp16")
    out = onnxio.check_output_path(out, force=force)
    adapter_out = out.with_name(out.name + "_adapter") if lora_as_inputs else None
    if adapter_out is not None and adapter_out.exists() and not force:
        raise OnnxfuseError(f"{adapter_out} exists; pass --force to overwrite it")
    return out, adapter_out


def export(kind: str, spec, out: str | pathlib.Path, *, seed: int = 0, dtype: str = "fp32", exporter: str = "auto",
           dynamic: bool = False, external_data: bool | None = None, force: bool = False,
           progress=None, lora_as_inputs: bool = False, multi_adapters: int = 0) -> ExportResult:
    """Build the PyTorch module of `kind` ("llama", "dlrm") from `spec` (a `zoo.LlamaSpec` / `zoo.DlrmSpec`), `seed`
    and `dtype` ("fp32", "fp16", "bf16"), export it to ONNX at `out` and store the recipe that rebuilds it.

    exporter: "dynamo", "torchscript", or "auto" (dynamo, falling back to TorchScript with a warning). dynamic:
    symbolic batch (and sequence) dims (always, for the upstream DLRM kinds: zoo.DLRM_UPSTREAM_KINDS).
    external_data: weights in `<out>.data` (None: automatic above 1.8 GB).
    An existing `out` is an error unless force. Nothing is left behind on failure (no partial .onnx or .data).
    progress(index, total, stage, detail), when given, is called as each stage starts (STAGES: module, export,
    write, and external data unless external_data=False), e.g. `onnxfuse._term.Stages("export")`.
    lora_as_inputs: the peft layers' A and B as graph inputs with zero defaults, their adapter in `<out>_adapter`
    (onnxfuse.adapters: onnxruntime's adapter format); multi_adapters N with it: adapters.to_multi_adapter (N slots).
    Raises OnnxfuseError (one line naming the fix) on bad arguments or when every exporter fails.
    """
    out, adapter_out = _check_request(spec, out, dtype, exporter, force, lora_as_inputs, multi_adapters)
    total = len(STAGES) - (external_data is False)

    def stage(i: int, detail: str) -> None:
        if progress is not None:
            progress(i + 1, total, STAGES[i], detail)

    stage(0, f"building the PyTorch {kind} module ({dtype}, seed {seed})")
    module = zoo.build_module(kind, spec, seed, dtype)
    inputs = zoo.make_inputs(kind, spec, seed, dtype)
    weight_bytes = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    if external_data is None:  # automatic: protobuf cannot hold a model past 2 GiB
        external_data = weight_bytes > onnxio.EXTERNAL_DATA_THRESHOLD
    names = list(inputs)
    outs = output_names(kind, spec)
    t0 = time.perf_counter()
    notes: list[str] = []
    parent = out.parent if str(out.parent) else pathlib.Path(".")
    # A temporary folder beside the output: the weights file is renamed into place, never copied across filesystems.
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".onnxfuse-", dir=parent))
    data_name = out.name + ".data"
    try:
        # The model is written under its final name, so a dynamo export's '<name>.data' is already the file that
        # onnxfuse's convention (and the model's external-data locations) name.
        tmp_path = tmp / out.name
        order, opset, dynamic = _export_plan(kind, exporter, dynamic)
        stage(1, f"torch.onnx ({' then '.join(order) if exporter == 'auto' else exporter} exporter; "
                 f"{weight_bytes / 1e6:.1f} MB of weights)")
        used = _export_with_fallback(module, inputs, tmp_path, order, names, outs,
                                     _dynamic(kind, spec, names) if dynamic else None, notes, opset)
        recipe = make_recipe(kind, spec, seed, dtype, inputs, used, dynamic)
        layers = adapters.lora_layers(module) if lora_as_inputs else None
        recipe.update({"adapter": adapter_out.name, "multi_adapters": multi_adapters} if lora_as_inputs else {})
        del module  # the exported weights are on disk now; do not hold a second copy while writing
        gc.collect()
        lean = external_data and _single_data_file(tmp_path, data_name) and not multi_adapters
        stage(2, f"{out} (recipe, onnx.checker)")
        # Small models (or an exporter that wrote its weights some other way): load everything, re-save. Big ones:
        # edit only the small graph file and rename the exporter's weights file into place (no copy of the weights).
        model = _stamped(onnx.load(str(tmp_path), load_external_data=not lean), recipe)
        if lora_as_inputs:  # the adapter file is written beside the model and moved into place after it
            _lift_adapters(model, layers, tmp / adapter_out.name, multi_adapters, tmp if lean else None)
        if lean:
            onnx.save_model(model, str(tmp_path))
            onnx.checker.check_model(str(tmp_path))  # by path: reads the graph, checks the weights file exists
            if total > 3:
                stage(3, f"{parent / data_name} ({weight_bytes / 1e6:.1f} MB, moved into place)")
            os.replace(tmp / data_name, parent / data_name)
            os.replace(tmp_path, out)
        else:
            # the checker cannot take a proto over 2 GiB
            if onnxio._weight_bytes(model) < onnxio.EXTERNAL_DATA_THRESHOLD:
                onnx.checker.check_model(model)
            if total > 3:
                stage(3, f"{parent / data_name} ({weight_bytes / 1e6:.1f} MB)" if external_data else
                      f"none: {weight_bytes / 1e6:.1f} MB of weights stay inside the .onnx (--external-data moves "
                      "them out)")
            onnxio.save(model, out, external_data=external_data)
        if lora_as_inputs:
            os.replace(tmp / adapter_out.name, adapter_out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    data_path = parent / data_name if (parent / data_name).is_file() and external_data else None
    return ExportResult(out, used, time.perf_counter() - t0, op_counts(model), recipe, notes, data_path, adapter_out)


def _inline_adapter_shaped(model: onnx.ModelProto, layers: dict, base_dir: pathlib.Path) -> None:
    """The lean write of a big model with --lora-as-inputs: read from the exporter's weights file only the initializers
    of an adapter weight's shape (adapters.lift_lora_inputs finds each A and B among them by value) into the graph
    file, so the rest of the weights are neither loaded nor written again (a 7B model's 13 GB). The lifted ones then
    hold inline zeros; their bytes stay unused in the weights file."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    wanted = {arr.shape for pair in layers.values() for arr in pair}
    for init in model.graph.initializer:
        if tuple(init.dims) in wanted and uses_external_data(init):
            load_external_data_for_tensor(init, str(base_dir))
            init.data_location = onnx.TensorProto.DEFAULT
            del init.external_data[:]


def _lift_adapters(model: onnx.ModelProto, layers: dict, path: pathlib.Path, multi_adapters: int,
                   lean_dir: pathlib.Path | None) -> None:
    """--lora-as-inputs: the peft layers' A and B as graph inputs of `model`, their weights to the adapter file
    `path`; with --adapters N, each layer then a MultiLoRALinear over stacks of N (adapters.to_multi_adapter).
    lean_dir: the model was loaded without its external data, which lies in that folder (_inline_adapter_shaped)."""
    if lean_dir is not None:
        _inline_adapter_shaped(model, layers, lean_dir)
    adapters.write_adapter(path, adapters.lift_lora_inputs(model, layers))
    if multi_adapters:
        adapters.to_multi_adapter(model, multi_adapters)


def _stamped(model: onnx.ModelProto, recipe: dict) -> onnx.ModelProto:
    """The exported model with an IR version onnxruntime loads, the recipe and onnxfuse as its producer."""
    model.ir_version = min(model.ir_version, onnxio.MAX_IR_VERSION) if model.ir_version else IR_VERSION
    onnxio.set_metadata(model, RECIPE_KEY, json.dumps(recipe))
    model.producer_name = "onnxfuse"
    model.producer_version = __version__
    return model


def _export_plan(kind: str, exporter: str, dynamic: bool) -> tuple[list[str], int, bool]:
    """The exporters to try, in order, the opset and whether the dims are symbolic: the upstream DLRM as its
    repository's --save-onnx writes it (TorchScript, opset 11, always its dynamic axes)."""
    if kind in zoo.DLRM_UPSTREAM_KINDS:
        return ["torchscript"], UPSTREAM_OPSET, True
    return (["dynamo", "torchscript"] if exporter == "auto" else [exporter]), ONNX_OPSET, dynamic


def _export_with_fallback(module, inputs, path: pathlib.Path, order: list[str], names, outs, dynamic_shapes,
                          notes: list[str], opset: int = ONNX_OPSET) -> str:
    """Export with the first exporter of `order` that works (its name returned); a dynamo failure before TorchScript
    is a warning and a note. Raises OnnxfuseError with every exporter's first error line when none works."""
    errors = []
    for name in order:
        try:
            torch_export(module, inputs, path, name, names, outs, dynamic_shapes, opset)
            return name
        except Exception as e:  # exporter failures are many and varied; keep the first line of each
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            errors.append(f"{name}: {type(e).__name__}: {msg[:300]}")
            if len(order) > 1 and name == "dynamo":
                notes.append(f"dynamo exporter failed ({msg[:200]}); fell back to the TorchScript exporter")
                warnings.warn(notes[-1])
            for f in path.parent.iterdir():  # a failed exporter's partial files
                f.unlink()
    raise OnnxfuseError("export failed: " + " | ".join(errors) + "; try --exporter torchscript or a smaller config")


def _single_data_file(path: pathlib.Path, data_name: str) -> bool:
    """True when every external tensor of the model at ``path`` lives in ``data_name`` beside it (dynamo's layout)."""
    from onnx.external_data_helper import uses_external_data
    m = onnx.load(str(path), load_external_data=False)
    locations = {e.value for t in m.graph.initializer if uses_external_data(t) for e in t.external_data
                 if e.key == "location"}
    return locations == {data_name} and (path.parent / data_name).is_file()


def torch_export(module, inputs: dict, path, exporter: str, input_names, output_names_, dynamic_axes=None,
                 opset: int = ONNX_OPSET) -> None:
    """torch.onnx.export of `module` on `inputs` (name -> tensor, passed positionally) to `path` with the "dynamo" or
    "torchscript" `exporter`, at onnxfuse's opset (or `opset`), with its progress prints and warnings captured
    (onnxfuse reports the outcome itself). dynamic_axes: {input name: {axis: name}} or None. The file is written as
    torch writes it (no onnxfuse recipe or IR-version cap: export() adds those)."""
    args = tuple(inputs.values())
    kwargs = dict(input_names=input_names, output_names=output_names_, opset_version=opset)
    sink = io.StringIO()
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            dyn = None
            if dynamic_axes:
                dyn = tuple({ax: torch.export.Dim.AUTO for ax in axes} for axes in dynamic_axes.values())
            torch.onnx.export(module, args, str(path), dynamo=True, dynamic_shapes=dyn, external_data=True,
                              verbose=False, **kwargs)
        else:
            torch.onnx.export(module, args, str(path), dynamo=False, dynamic_axes=dynamic_axes, **kwargs)
