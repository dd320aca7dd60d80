"""Serving a model with Netron from this process (the `netron` package's server: netron.start / stop / wait).

The server binds to loopback unless allow_remote is given with a non-loopback host: Netron serves every file in
the model's folder under /data/. Each served model gets its own request-handler class, so two models (`onnxfuse view
--diff`) can be served side by side in one process.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import logging
import pathlib
import signal
import socket

from .. import onnxio
from ..errors import OnnxfuseError

DEFAULT_HOST = "127.0.0.1"
DOMAIN = "onnxfuse"


@dataclasses.dataclass
class Served:
    """A model served by Netron: stop it with stop(served)."""

    path: pathlib.Path
    host: str
    port: int
    fused_nodes: list[str]  # names of the onnxfuse nodes, in graph order

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"


def netron_module():
    """The netron package (an optional dependency), or one line naming the install command."""
    try:
        import netron
        import netron.server  # noqa: F401
    except ImportError:
        raise OnnxfuseError("onnxfuse view needs the netron package, which is not installed; "
                            "pip install 'onnxfuse[view]'") from None
    return netron


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool = False) -> None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None and ip.version == 6:
        raise OnnxfuseError(f"--host {host}: Netron's server listens on IPv4 only; use --host 127.0.0.1")
    if not is_loopback(host) and not allow_remote:
        raise OnnxfuseError(f"--host {host} is not a loopback address: anyone who can reach it could read the model "
                            "and every file beside it; add --allow-remote to serve it there anyway, or drop --host")


def _check_port(host: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise OnnxfuseError(f"--port {port}: not a TCP port; give 1-65535 (or 0 for any free port)")
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise OnnxfuseError(f"{host}:{port}: cannot listen there ({e.strerror}); pick another --port, "
                                "or leave --port out for a free one") from None


def validate(path) -> tuple[pathlib.Path, list[str]]:
    """(path, names of its onnxfuse nodes) of a model that loads; one-line errors for missing/empty/broken files."""
    p = pathlib.Path(path)
    model = onnxio.load(p, load_external_data=False)
    fused = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(model.graph.node) if n.domain == DOMAIN]
    return p, fused


def serve(path, host: str = DEFAULT_HOST, port: int | None = None, *, allow_remote: bool = False,
          browse: bool = False) -> Served:
    """Serve one model with Netron and return at once (the server runs in a daemon thread of this process).

    port None: Netron's choice (8080 if free, else another); 0: any free port.
    """
    netron = netron_module()

    check_host(host, allow_remote)
    p, fused = validate(path)
    if port is not None:
        _check_port(host, port)
    logging.getLogger("netron.server").setLevel(logging.WARNING)  # we print the URL ourselves
    if not logging.getLogger().hasHandlers():
        logging.getLogger().addHandler(logging.NullHandler())  # else netron.serve() calls logging.basicConfig()
    try:
        h, port = netron.start(str(p.resolve()), address=(host, port if port is not None else None), browse=browse)
    except OSError as e:
        raise OnnxfuseError(f"{host}:{port}: cannot serve there ({e.strerror or e}); pick another --port") from None
    # netron keeps the served file in a class attribute of its one request-handler class, so a second
    # netron.start() in this process would make the first server show the second model too (--diff).
    # Give this server its own handler subclass that holds its own content.
    for thread in netron.server._threads((host, port)):
        base = thread.server.RequestHandlerClass
        thread.server.RequestHandlerClass = type("_OnnxfuseHandler", (base,), {"content": base.content})
    return Served(p, host, port, fused)


def stop(served: Served | None = None) -> None:
    """Stop one served model (or all of them in this process)."""
    import netron
    netron.stop(served.address if served is not None else None)


def wait() -> None:
    """Block until Ctrl-C (or SIGTERM), then stop every server of this process."""
    import netron
    with sigterm_exits():
        try:
            netron.wait()  # returns when all servers stopped; stops them all on KeyboardInterrupt / SystemExit
        finally:
            netron.stop()


class sigterm_exits:
    """SIGTERM raises SystemExit (so servers stop cleanly, exit 0), in the main thread only."""

    def __enter__(self):
        import threading
        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGTERM, self._term)
        return self

    @staticmethod
    def _term(signum, frame):
        raise SystemExit(0)

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
        return False
