"""Loading and saving ONNX models: clear errors on bad files, atomic writes (no half-written output), external data."""
from __future__ import annotations

import os
import pathlib
import tempfile

import onnx

from .errors import OnnxfuseError
from .schema import IR_VERSION

# protobuf cannot serialise a single message over 2 GiB: past this, weights go to an external data file.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
MAX_IR_VERSION = 13  # highest IR version onnxruntime 1.31 loads


def load(path: str | os.PathLike, load_external_data: bool = True) -> onnx.ModelProto:
    p = pathlib.Path(path)
    if not p.exists():
        raise OnnxfuseError(f"{p}: no such file; give the path of an .onnx model "
                            "(e.g. one written by 'onnxfuse export')")
    if p.is_dir():
        raise OnnxfuseError(f"{p}: is a directory; give the path of an .onnx model file")
    if p.stat().st_size == 0:
        raise OnnxfuseError(f"{p}: empty file; re-export the model with 'onnxfuse export'")
    try:
        model = onnx.load(str(p), load_external_data=load_external_data)
    except PermissionError:
        raise OnnxfuseError(f"{p}: not readable (permission denied); fix its permissions or copy it somewhere readable")
    except Exception as e:  # protobuf DecodeError, truncated files, missing external data
        raise OnnxfuseError(f"{p}: not a readable ONNX model "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'parse error'}); "
                            "re-export it with 'onnxfuse export'") from None
    if not model.graph.node and not model.graph.output:
        raise OnnxfuseError(f"{p}: not an ONNX model (no graph); re-export it with 'onnxfuse export'")
    return model


def write_atomic(path: str | os.PathLike, data: bytes | str) -> pathlib.Path:
    """Write `data` to `path` through a temporary file beside it, renamed into place: a reader never sees a
    half-written file, and a failure leaves the old one (or none). The one writer of onnxfuse's small files
    (reports, results, tables, screenshots, npz outputs)."""
    p = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return p


def check_output_path(path: str | os.PathLike, force: bool = False) -> pathlib.Path:
    """Refuse before any work is done if the output cannot be written."""
    p = pathlib.Path(path)
    if p.exists() and p.is_dir():
        raise OnnxfuseError(f"{p}: is a directory; give a file path with -o")
    if p.exists() and not force:
        raise OnnxfuseError(f"{p}: already exists; pass --force to overwrite it or choose another path with -o")
    parent = p.parent if str(p.parent) else pathlib.Path(".")
    if not parent.exists():
        raise OnnxfuseError(f"{parent}: output directory does not exist; "
                            "create it first or choose another path with -o")
    if not parent.is_dir():
        raise OnnxfuseError(f"{parent}: is not a directory; choose another output path with -o")
    if not os.access(parent, os.W_OK) or not _can_create_in(parent):
        raise OnnxfuseError(f"{parent}: output directory is not writable; choose another path with -o")
    return p


def _can_create_in(folder: pathlib.Path) -> bool:
    """Try it (os.access says yes to root even on a read-only filesystem)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".onnxfuse-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def save(model: onnx.ModelProto, path: str | os.PathLike, external_data: bool | None = None) -> pathlib.Path:
    """Write atomically: into a temporary file beside the target, then rename. External data goes to '<name>.data'.

    external_data=None chooses automatically (needed when the model would pass protobuf's 2 GiB limit).
    """
    p = pathlib.Path(path)
    if model.ir_version > MAX_IR_VERSION or model.ir_version == 0:
        model.ir_version = IR_VERSION
    if external_data is None:
        external_data = _weight_bytes(model) > EXTERNAL_DATA_THRESHOLD if _all_data_inline(model) else True
    parent = p.parent if str(p.parent) else pathlib.Path(".")
    tmpdir = tempfile.mkdtemp(prefix=".onnxfuse-", dir=parent)
    try:
        tmp_model = pathlib.Path(tmpdir) / p.name
        if external_data:
            data_name = p.name + ".data"
            onnx.save_model(model, str(tmp_model), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data_name, size_threshold=1024)
            data = pathlib.Path(tmpdir) / data_name
            if data.exists():
                os.replace(data, parent / data_name)
        else:
            onnx.save_model(model, str(tmp_model))
        os.replace(tmp_model, p)
    finally:
        for f in pathlib.Path(tmpdir).glob("*"):
            f.unlink()
        os.rmdir(tmpdir)
    return p


def _weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers' data (ByteSize() of a proto past 2 GiB is not reliable, and costs a pass)."""
    from onnx.external_data_helper import _get_all_tensors
    return sum(len(t.raw_data) or t.ByteSize() for t in _get_all_tensors(model))


def _all_data_inline(model: onnx.ModelProto) -> bool:
    from onnx.external_data_helper import uses_external_data
    return not any(uses_external_data(t) for t in model.graph.initializer)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node counts per op type ('domain::Op' for non-standard domains), main graph only, sorted by count."""
    import collections
    c = collections.Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                            for n in model.graph.node)
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def get_metadata(model: onnx.ModelProto, key: str) -> str | None:
    for prop in model.metadata_props:
        if prop.key == key:
            return prop.value
    return None


def set_metadata(model: onnx.ModelProto, key: str, value: str) -> None:
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    model.metadata_props.add(key=key, value=value)
