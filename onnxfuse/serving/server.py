"""The Triton Inference Server that PyTriton (`pip install nvidia-pytriton`) ships, run on a model repository.

PyTriton's wheel carries `tritonserver` and its Python backend with a stub per Python version. `TritonServer`
starts that binary directly (not PyTriton's proxy): a workspace holds the backend folder with the stub of this
interpreter's version, the server listens on 127.0.0.1 unless told otherwise (HTTP, gRPC and Prometheus metrics on
three ports), and its environment lets the stub load this interpreter's libpython (LD_LIBRARY_PATH = its LIBDIR: the
system's libpython of the same minor version can be a different patch release whose stdlib does not match) and
import onnxfuse, onnxruntime and numpy from this environment (this interpreter's bin first on PATH, from which
the embedded interpreter finds its prefix, and PYTHONPATH). `stop()` asks the server to exit
(SIGINT), then kills its process group, so no stub is left behind.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request

from ..errors import OnnxfuseError

INSTALL_HINT = "pip install nvidia-pytriton 'tritonclient[http]' (or pip install 'onnxfuse[serve]')"


def triton_dist() -> pathlib.Path:
    """PyTriton's tritonserver folder (bin/, backends/, python_backend_stubs/)."""
    import importlib.util
    spec = importlib.util.find_spec("pytriton")  # found, not imported: the server needs none of its Python client
    if spec is None or not spec.submodule_search_locations:
        raise OnnxfuseError(f"onnxfuse serve needs the Triton server that PyTriton ships: {INSTALL_HINT}")
    dist = pathlib.Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    if not (dist / "bin" / "tritonserver").is_file():
        raise OnnxfuseError(f"{dist}: PyTriton's tritonserver binary is missing; reinstall nvidia-pytriton")
    return dist


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _backends(dist: pathlib.Path, workspace: pathlib.Path) -> pathlib.Path:
    """backends/python with this interpreter's stub (links to PyTriton's files, nothing copied)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise OnnxfuseError(f"PyTriton has no Python-backend stub for Python {version}; use Python 3.8-3.13")
    python = workspace / "backends" / "python"
    python.mkdir(parents=True)
    for f in (dist / "backends" / "python").iterdir():
        if f.is_file():
            (python / f.name).symlink_to(f)
    (python / "triton_python_backend_stub").symlink_to(stub)
    return workspace / "backends"


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    # the stub's interpreter finds its prefix (a venv's pyvenv.cfg and site-packages) from `python3` on PATH
    env["PATH"] = os.pathsep.join((str(pathlib.Path(sys.exec_prefix) / "bin"), env.get("PATH", "")))
    root = str(pathlib.Path(__file__).resolve().parents[2])  # onnxfuse's parent (a checkout or site-packages)
    # this interpreter's own search order (a PYTHONPATH entry ahead of site-packages stays ahead: an onnxruntime-gpu
    # unpacked beside a CPU onnxruntime is the one the stub imports too), site-packages after it
    paths = [root, *sys.path, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p and os.path.isdir(p)))
    env["ONNXFUSE_SYS_PATH"] = env["PYTHONPATH"]  # triton_model.py puts it first in the stub (see there)
    return env


class TritonServer:
    """`tritonserver` on `repository` (a context manager: started on enter, stopped on exit)."""

    def __init__(self, repository, *, host: str = "127.0.0.1", http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None, log_verbose: int = 0):
        self.repository = pathlib.Path(repository)
        self.host = host
        self.http_port = http_port or free_port(host)
        self.grpc_port = grpc_port or free_port(host)
        self.metrics_port = metrics_port or free_port(host)
        self.log_verbose = log_verbose
        self.proc: subprocess.Popen | None = None
        self.workspace: pathlib.Path | None = None
        self.log_path: pathlib.Path | None = None

    @property
    def url(self) -> str:
        return f"{self.host}:{self.http_port}"

    def command(self, backends: pathlib.Path) -> list[str]:
        dist = triton_dist()
        return [str(dist / "bin" / "tritonserver"), f"--model-repository={self.repository}",
                f"--backend-directory={backends}", f"--http-address={self.host}", f"--http-port={self.http_port}",
                f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}", "--allow-metrics=true",
                "--allow-gpu-metrics=false", f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
                "--strict-readiness=true", "--exit-timeout-secs=5", f"--log-verbose={self.log_verbose}"]

    def start(self, timeout: float = 120.0) -> TritonServer:
        dist = triton_dist()
        self.workspace = pathlib.Path(tempfile.mkdtemp(prefix="onnxfuse-triton-"))
        backends = _backends(dist, self.workspace)
        self.log_path = self.workspace / "server.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(backends), stdout=log, stderr=subprocess.STDOUT,
                                         env=server_env(), start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise OnnxfuseError(f"the Triton server exited with {self.proc.returncode} while starting: {tail}")
            if self.ready():
                return self
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise OnnxfuseError(f"the Triton server was not ready after {timeout:.0f} s: {tail}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = 12) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        errors = [t for t in text if t.startswith("E") or "error" in t.lower()]
        return " | ".join((errors or text)[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGINT (the server unloads its models and stops its stubs), then SIGKILL to the whole process group."""
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGINT)
                    proc.wait(timeout=timeout)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stubs that outlived the server
            except (ProcessLookupError, PermissionError):
                pass
            if proc.poll() is None:
                proc.wait(timeout=5)
        if self.workspace is not None:
            shutil.rmtree(self.workspace, ignore_errors=True)
            self.workspace = None

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
