"""The load test: tritonclient over HTTP on loopback, bounded in requests and time, every response checked.

`run_cell` keeps `concurrency` requests in flight (one thread and one HTTP connection each) until `max_requests`
were sent or `max_seconds` passed, each request one of `requests` (prepared inputs) and its response compared
with `references` (the same input run directly in onnxruntime: a wrong answer counts, it is not an error).
It reports requests/s, p50/p99 latency, errors, wrong answers and the batch Triton's dynamic batcher formed
(inferences per model execution, from the server's statistics over the cell).
"""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

TRITON_DTYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16", np.dtype(np.float64): "FP64",
                 np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32", np.dtype(np.bool_): "BOOL",
                 np.dtype(np.uint8): "UINT8", np.dtype(np.int8): "INT8"}


@dataclasses.dataclass
class Cell:
    model: str
    concurrency: int
    batch: int
    requests: int            # answered (right or wrong) + errors
    seconds: float
    rps: float               # answered requests per second
    rows_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    errors: int
    wrong: int
    avg_batch: float | None  # inferences per execution in the server during the cell
    first_error: str = ""


def _inputs(feeds: dict[str, np.ndarray]):
    import tritonclient.http as th
    out = []
    for name, value in feeds.items():
        i = th.InferInput(name, list(value.shape), TRITON_DTYPES[value.dtype])
        i.set_data_from_numpy(value, binary_data=True)
        out.append(i)
    return out


def _stats(client, model: str) -> tuple[int, int]:
    s = client.get_inference_statistics(model)["model_stats"][0]
    return int(s["execution_count"]), int(s["inference_count"])


def run_cell(url: str, model: str, output: str, requests: list[dict], references: list[np.ndarray], *,
             concurrency: int, max_requests: int, max_seconds: float, warmup: int = 4, rtol: float = 1e-4,
             atol: float = 1e-5) -> Cell:
    """One (model, concurrency, batch) measurement; `requests[k]` and `references[k]` are one input and its
    expected output."""
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    probe = th.InferenceServerClient(url)
    for k in range(warmup):
        probe.infer(model, _inputs(requests[k % len(requests)]))
    ex0, inf0 = _stats(probe, model)
    lock = threading.Lock()
    state = {"next": 0, "errors": 0, "wrong": 0, "first_error": ""}
    latencies: list[float] = []
    deadline = time.monotonic() + max_seconds

    def worker() -> None:
        client = th.InferenceServerClient(url, connection_timeout=120.0, network_timeout=120.0)
        wanted = [th.InferRequestedOutput(output, binary_data=True)]
        while True:
            with lock:
                if state["next"] >= max_requests or time.monotonic() > deadline:
                    return
                k = state["next"] % len(requests)
                state["next"] += 1
            inputs = _inputs(requests[k])
            t0 = time.perf_counter()
            try:
                got = client.infer(model, inputs, outputs=wanted).as_numpy(output)
            except InferenceServerException as e:
                with lock:
                    state["errors"] += 1
                    state["first_error"] = state["first_error"] or str(e)[:200]
                continue
            dt = time.perf_counter() - t0
            ok = got is not None and got.shape == references[k].shape and \
                np.allclose(got, references[k], rtol=rtol, atol=atol)
            with lock:
                latencies.append(dt)
                state["wrong"] += 0 if ok else 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    ex1, inf1 = _stats(probe, model)
    lat = np.array(latencies) * 1e3
    batch = len(next(iter(requests[0].values())))
    return Cell(model, concurrency, batch, len(latencies) + state["errors"], round(seconds, 3),
                round(len(latencies) / seconds, 1), round(len(latencies) * batch / seconds, 1),
                round(float(np.percentile(lat, 50)), 3) if len(lat) else None,
                round(float(np.percentile(lat, 99)), 3) if len(lat) else None,
                state["errors"], state["wrong"], round((inf1 - inf0) / (ex1 - ex0), 2) if ex1 > ex0 else None,
                state["first_error"])


def references(model_path, requests: list[dict], output: str, library=None, provider: str = "cpu") -> list[np.ndarray]:
    """Each request's output from a direct onnxruntime run of the model file (the kernel library registered) on
    `provider`, the one the server runs it on."""
    from .. import runtime
    session = runtime.session(str(model_path), provider, library=library)
    return [session.run([output], feeds)[0] for feeds in requests]


def markdown(cells: list[Cell]) -> str:
    rows = ["| model | concurrency | request batch | requests/s | rows/s | p50 ms | p99 ms | avg batch formed | "
            "errors | wrong |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        rows.append(f"| {c.model} | {c.concurrency} | {c.batch} | {c.rps} | {c.rows_per_s} | {c.p50_ms} | "
                    f"{c.p99_ms} | {c.avg_batch} | {c.errors} | {c.wrong} |")
    return "\n".join(rows)
