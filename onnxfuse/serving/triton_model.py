"""onnxfuse's model for Triton's Python backend (copied into a repository as `1/model.py` by `onnxfuse serve`).

Each instance opens the model (`onnxfuse_model` beside this file) in onnxruntime through `onnxfuse.runtime.session`:
the kernel library registered (`onnxfuse_library`, else the cached build), on `onnxfuse_provider` (cpu or cuda),
with `onnxfuse_threads` intra-op threads when given (0: onnxruntime's default). On cuda each instance runs on the
GPU Triton placed it on, through IOBinding (CudaRunner). Tensors cross the backend through
DLPack (see _as_numpy).
Triton has already checked every request's inputs against config.pbtxt (names, data types, dims). With dynamic
batching, `execute` gets the requests the batcher gathered: their inputs are concatenated on axis 0, run once, and
the outputs split back by each request's batch. A request that still fails (e.g. a shape the model refuses) gets
its own error response; the others are answered.
"""
import json
import os
import sys


def _search_path_of_the_server() -> None:
    """The launching interpreter's module search order (ONNXFUSE_SYS_PATH, set by `onnxfuse serve`) ahead of the
    stub's own: the stub's embedded interpreter can start with its venv's site-packages first, so an onnxruntime-gpu
    on the launcher's PYTHONPATH would lose to a CPU onnxruntime installed in the venv."""
    wanted = [p for p in os.environ.get("ONNXFUSE_SYS_PATH", "").split(os.pathsep) if p]
    sys.path[:] = wanted + [p for p in sys.path if p not in wanted]


_search_path_of_the_server()

import numpy as np  # noqa: E402  (after the search path)

try:  # the Python backend's module; absent outside Triton (the tests import this file for `run_batch`)
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - only inside Triton
    pb_utils = None


def run_batch(session, input_names: list, output_names: list, feeds_per_request: list) -> list:
    """Each request's outputs from one onnxruntime run over all the requests' inputs concatenated on axis 0, split
    back by each request's rows (a single request runs as it is)."""
    if len(feeds_per_request) == 1:
        return [session.run(output_names, feeds_per_request[0])]
    sizes = [len(f[input_names[0]]) for f in feeds_per_request]
    feeds = {n: np.concatenate([f[n] for f in feeds_per_request], axis=0) for n in input_names}
    outs = session.run(output_names, feeds)
    split = [np.split(o, np.cumsum(sizes)[:-1], axis=0) for o in outs]
    return [[parts[k] for parts in split] for k in range(len(feeds_per_request))]


class CudaRunner:
    """`run(output_names, feeds)` on an onnxruntime CUDA session through IOBinding: each input copied to the device
    as an OrtValue, the outputs allocated by onnxruntime on the device and copied back once the run is done.
    `device_id` is the GPU Triton gave the instance (a KIND_GPU instance group places its instances per GPU)."""

    def __init__(self, session, device_id: int = 0):
        import onnxruntime
        self.session = session
        self.device_id = int(device_id)
        self._ortvalue = onnxruntime.OrtValue.ortvalue_from_numpy

    def run(self, output_names, feeds: dict) -> list:
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, self._ortvalue(np.ascontiguousarray(value), "cuda", self.device_id))
        for name in output_names or [o.name for o in self.session.get_outputs()]:
            binding.bind_output(name, "cuda", self.device_id)
        binding.synchronize_inputs()
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()


def open_runner(model: str, provider: str, *, library=None, threads: int = 0, device_id: int = 0):
    """The model's onnxruntime session as the Python model runs it: `runtime.session` with the kernel library;
    on the CUDA provider (GPU `device_id`) wrapped in a CudaRunner, so requests run through IOBinding."""
    from onnxfuse import runtime
    so = None
    if threads > 0:  # intra-op threads per instance (several instances share the cores)
        import onnxruntime
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
    if provider == "cuda":
        session = runtime.session(model, "cuda", library=library, sess_options=so,
                                  provider_options={"device_id": str(int(device_id))})
        return CudaRunner(session, device_id)
    return runtime.session(model, provider, library=library, sess_options=so)


class _Capsule:
    """A DLPack capsule as numpy.from_dlpack takes it (an object with __dlpack__ on the CPU)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, *args, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def _as_numpy(tensor) -> np.ndarray:
    """A request tensor as a numpy array through DLPack, a copy the run may keep. The backend's as_numpy goes through
    the numpy C API the stub was built against (numpy 1): under numpy 2 it hands back wrong data."""
    return np.array(np.from_dlpack(_Capsule(tensor.to_dlpack())), copy=True)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        here = os.path.dirname(os.path.abspath(__file__))
        model = os.path.join(here, params.get("onnxfuse_model", "model.onnx"))
        self.session = open_runner(model, params.get("onnxfuse_provider", "cpu"),
                                   library=params.get("onnxfuse_library") or None,
                                   threads=int(params.get("onnxfuse_threads", "0") or 0),
                                   device_id=int(args.get("model_instance_device_id", "0") or 0))
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]
        self.batched = int(config.get("max_batch_size", 0)) > 0

    def execute(self, requests):
        feeds = [{n: _as_numpy(pb_utils.get_input_tensor_by_name(r, n)) for n in self.inputs} for r in requests]
        try:
            results = run_batch(self.session, self.inputs, self.outputs, feeds) if self.batched else \
                [self.session.run(self.outputs, f) for f in feeds]
        except Exception:  # one bad request must not fail its batch: run each alone, answer each
            results = []
            for f in feeds:
                try:
                    results.append(self.session.run(self.outputs, f))
                except Exception as e:
                    results.append(e)
        responses = []
        for res in results:
            if isinstance(res, Exception):
                msg = str(res).strip().splitlines()[0] if str(res).strip() else type(res).__name__
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(msg)))
            else:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor.from_dlpack(n, np.ascontiguousarray(v))
                                    for n, v in zip(self.outputs, res)]))
        return responses

    def finalize(self):
        self.session = None
