"""`onnxfuse view`: look at a (fused) model in Netron, served from this machine, and screenshot it headlessly.

    onnxfuse view model.fused.onnx                      # serve on 127.0.0.1, open a browser, Ctrl-C to stop
    onnxfuse view --diff model.onnx model.fused.onnx    # both models, two ports, side by side
    onnxfuse view --screenshot out.png model.fused.onnx # PNG of the first fused node, its properties in the sidebar

Serving uses the `netron` package's server (netron.start / netron.stop / netron.wait). It binds to loopback unless
--allow-remote is given with a non-loopback --host: Netron serves every file in the model's folder under /data/.

Screenshots drive Debian's /usr/bin/chromium (or $ONNXFUSE_CHROMIUM) headless over the DevTools protocol on a pipe
(--remote-debugging-pipe; no port is opened). The plain `chromium --screenshot URL` cannot show a Netron graph: in a
fresh profile Netron first asks for cookie consent (it looks the country up on ipinfo.io, which fails offline, so it
asks) and waits for a click. Over the protocol we set that cookie in a throw-away profile, turn on Netron's
"show attributes" option, wait until the graph is drawn, select the fused node and capture the window.
"""
from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json
import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from . import onnxio
from .errors import OnnxfuseError

DEFAULT_HOST = "127.0.0.1"
DOMAIN = "onnxfuse"
CHROMIUM = "/usr/bin/chromium"
INSTALL_HINT = "install it with 'scripts/install_chromium.sh' (or 'apt-get install chromium'), " \
               "or set ONNXFUSE_CHROMIUM to a Chromium/Chrome binary"
DEFAULT_WINDOW = (1600, 1000)
# Flags for a closed network: nothing in the background may try to reach the internet (and stall the page).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-default-apps", "--disable-extensions", "--hide-scrollbars", "--mute-audio"]


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


# ------------------------------------------------------------------------------------------------------ serving

def _netron():
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


def _validate(path) -> tuple[pathlib.Path, list[str]]:
    p = pathlib.Path(path)
    model = onnxio.load(p, load_external_data=False)  # clear one-line errors for missing/empty/broken files
    fused = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(model.graph.node) if n.domain == DOMAIN]
    return p, fused


def serve(path, host: str = DEFAULT_HOST, port: int | None = None, *, allow_remote: bool = False,
          browse: bool = False) -> Served:
    """Serve one model with Netron and return at once (the server runs in a daemon thread of this process).

    port None: Netron's choice (8080 if free, else another); 0: any free port.
    """
    netron = _netron()

    check_host(host, allow_remote)
    p, fused = _validate(path)
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
    with _sigterm_exits():
        try:
            netron.wait()  # returns when all servers stopped; stops them all on KeyboardInterrupt / SystemExit
        finally:
            netron.stop()


class _sigterm_exits:
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


# ------------------------------------------------------------------------------------------------------ headless Chromium

def find_chromium() -> str:
    exe = os.environ.get("ONNXFUSE_CHROMIUM") or CHROMIUM
    found = exe if os.path.isabs(exe) else shutil.which(exe)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise OnnxfuseError(f"Chromium not found at {exe}: {INSTALL_HINT}")
    return found


class Headless:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3/4), in a throw-away profile."""

    def __init__(self, window: tuple[int, int] = DEFAULT_WINDOW, chromium: str | None = None):
        exe = chromium or find_chromium()
        self._profile = tempfile.mkdtemp(prefix="onnxfuse-chromium-")
        to_r, self._w = os.pipe()
        self._r, from_w = os.pipe()

        def child_fds():  # in the child, before exec: the protocol pipes become fds 3 (commands) and 4 (replies)
            a, b = os.dup(to_r), os.dup(from_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={self._profile}", f"--window-size={window[0]},{window[1]}",
                "--remote-debugging-pipe", "about:blank"]
        self._stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
                                         preexec_fn=child_fds, close_fds=False)
        finally:
            os.close(to_r)
            os.close(from_w)
        self._id = 0
        self._buf = b""
        self.session = None
        try:
            targets = self.call("Target.getTargets", browser=True)["targetInfos"]
            page = next(t["targetId"] for t in targets if t["type"] == "page")
            self.session = self.call("Target.attachToTarget", {"targetId": page, "flatten": True},
                                     browser=True)["sessionId"]
            self.call("Page.enable")
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": window[0], "height": window[1], "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.close()
            raise

    def call(self, method: str, params: dict | None = None, *, browser: bool = False, timeout: float = 30.0) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not browser:
            msg["sessionId"] = self.session
        try:
            os.write(self._w, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:
            raise OnnxfuseError(f"headless Chromium exited early: {self._last_error()}") from None
        deadline = time.monotonic() + timeout
        import select
        while True:
            while b"\0" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._r], [], [], left)[0]:
                    raise OnnxfuseError(f"headless Chromium did not answer {method} within {timeout:.0f} s")
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise OnnxfuseError(f"headless Chromium exited early: {self._last_error()}")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise OnnxfuseError(f"headless Chromium: {method} failed: {reply['error'].get('message')}")
                return reply.get("result", {})

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise OnnxfuseError(f"headless Chromium: script failed: {r['exceptionDetails'].get('text')}")
        return r.get("result", {}).get("value")

    def _last_error(self) -> str:
        try:
            self._stderr.seek(0)
            lines = [ln for ln in self._stderr.read().decode(errors="replace").splitlines()
                     if ln.strip() and "dbus" not in ln and "DBus" not in ln]
            return lines[-1][-300:] if lines else f"exit code {self.proc.poll()}"
        except Exception:
            return "no message"

    def close(self) -> None:
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


_READY_JS = """(() => {
  const body = document.body;
  if (!body) return 'loading';
  if (body.classList.contains('alert')) {
    const m = document.getElementById('message-text');
    return 'error:' + (m ? m.innerText : 'Netron could not open the model');
  }
  const nodes = document.querySelectorAll('#canvas g.graph-node').length;
  return body.classList.contains('default') && nodes > 0 ? 'ready:' + nodes : 'loading';
})()"""


def open_netron(browser: Headless, url: str, *, attributes: bool = True, names: bool = False,
                timeout: float = 60.0) -> int:
    """Load Netron at url, past its cookie prompt, with display options; wait for the graph. Returns its node count."""
    browser.call("Network.setCookie", {"name": "consent", "value": str(int(time.time() * 1000)), "url": url,
                                       "expires": time.time() + 86400})
    options = {"attributes": attributes, "names": names}
    browser.call("Page.addScriptToEvaluateOnNewDocument",
                 {"source": f"try {{ localStorage.setItem('options', {json.dumps(json.dumps(options))}); }} catch (e) {{}}"})
    browser.call("Page.navigate", {"url": url})
    deadline = time.monotonic() + timeout
    state = "loading"
    while time.monotonic() < deadline:
        state = browser.evaluate(_READY_JS) or "loading"
        if state.startswith("ready:"):
            time.sleep(0.2)  # let the last layout pass settle
            return int(state.split(":", 1)[1])
        if state.startswith("error:"):
            raise OnnxfuseError(f"Netron could not show the model: {state[6:].strip()}")
        time.sleep(0.1)
    raise OnnxfuseError(f"Netron did not draw the graph within {timeout:.0f} s; try a smaller model or a longer --timeout")


def dom(url: str, *, window: tuple[int, int] = DEFAULT_WINDOW, names: bool = False, timeout: float = 60.0) -> str:
    """The DOM of Netron's page at url once the graph is drawn (an SVG: op types as text, node names as <title>)."""
    with Headless(window) as b:
        open_netron(b, url, names=names, timeout=timeout)
        return b.evaluate("document.documentElement.outerHTML")


_FOCUS_JS = """((name, select) => {
  let node = name ? document.getElementById('node-name-' + name) : null;
  if (!node) node = document.querySelector('#canvas g.graph-node');
  if (!node) return null;
  node.scrollIntoView({block: 'center', inline: 'center'});
  const title = node.querySelector('.node-item-type');
  if (select && title) title.dispatchEvent(new MouseEvent('click', {bubbles: true}));
  return node.id;
})"""


_WRAP_JS = """(() => {
  const style = document.createElement('style');
  style.textContent = '.sidebar-item-value-line { white-space: pre-wrap !important; overflow-wrap: anywhere; }';
  document.head.appendChild(style);
})()"""


def screenshot(path, out, *, node: str | None = None, window: tuple[int, int] = DEFAULT_WINDOW, sidebar: bool = True,
               force: bool = False, timeout: float = 60.0) -> dict:
    """Render the model in Netron headlessly and write a PNG of the graph around `node` (default: the first onnxfuse
    node, else the top of the graph), that node selected so the sidebar shows its name, attributes and description."""
    try:
        out = onnxio.check_output_path(out, force=force)
    except OnnxfuseError as e:
        raise OnnxfuseError(str(e).replace("with -o", "with --screenshot")) from None
    exe = find_chromium()
    served = serve(path, DEFAULT_HOST, 0)
    try:
        if node is not None and node not in _all_node_names(served.path):
            raise OnnxfuseError(f"--node {node!r}: no node of that name in {served.path}; "
                                "Netron lists them (onnxfuse view MODEL, then View > Show Names)")
        target = node or (served.fused_nodes[0] if served.fused_nodes else None)
        with Headless(window, exe) as b:
            count = open_netron(b, served.url, timeout=timeout)
            shown = b.evaluate(f"{_FOCUS_JS}({json.dumps(target)}, {json.dumps(sidebar)})")
            if sidebar:  # Netron keeps each property on one line (white-space: pre, scrolled sideways in the
                b.evaluate(_WRAP_JS)  # browser); a PNG cannot scroll, so wrap them
            time.sleep(0.3)
            data = base64.b64decode(b.call("Page.captureScreenshot", {"format": "png"})["data"])
    finally:
        stop(served)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return {"path": str(out), "bytes": len(data), "nodes_drawn": count, "fused_nodes": len(served.fused_nodes),
            "selected": (shown or "").removeprefix("node-name-") or None}


def _all_node_names(path) -> set[str]:
    return {n.name for n in onnxio.load(path, load_external_data=False).graph.node}


# ------------------------------------------------------------------------------------------------------ command line

def _window(text: str) -> tuple[int, int]:
    import argparse
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WIDTHxHEIGHT, like 1600x1000")
    if not (200 <= w <= 8000 and 200 <= h <= 8000):
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be 200-8000 pixels")
    return w, h


def _port(text: str) -> int:
    import argparse
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number")
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"{v}: a port is 1-65535 (0: any free port)")
    return v


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", metavar="MODEL", help="the .onnx model to show")
    p.add_argument("--diff", nargs=2, metavar=("UNFUSED", "FUSED"),
                   help="serve two models (e.g. before and after 'onnxfuse fuse') on two ports")
    p.add_argument("--port", type=_port, help="port to serve on (default: 8080 if free, else another; "
                   "with --diff the second model gets PORT+1; 0: any free port)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to serve on (default {DEFAULT_HOST}; "
                   "a non-loopback address needs --allow-remote)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host (the model and the files beside it become readable there)")
    p.add_argument("--no-browser", action="store_true", help="do not open a web browser; just print the URL")
    p.add_argument("--screenshot", "-o", metavar="PNG",
                   help="render the model in headless Chromium, write this PNG and exit (no server left running)")
    p.add_argument("--node", help="with --screenshot: the node to center and select (default: the first onnxfuse node)")
    p.add_argument("--window", type=_window, default=DEFAULT_WINDOW, metavar="WxH",
                   help="with --screenshot: the browser window in pixels (default 1600x1000)")
    p.add_argument("--no-sidebar", action="store_true", help="with --screenshot: leave out the node's properties")
    p.add_argument("--timeout", type=float, default=60.0, help="with --screenshot: seconds to wait for Netron (default 60)")
    p.add_argument("--force", action="store_true", help="with --screenshot: overwrite an existing PNG")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--json", action="store_true",
                   help="print JSON: the screenshot's summary, or one line per served model with its URL")


def run(args, *, block: bool = True) -> int:
    """The `view` command. block=False returns as soon as the server(s) run (stop them with view.stop())."""
    models = list(args.diff) if args.diff else ([args.model] if args.model else [])
    if args.diff and args.model:
        raise OnnxfuseError("give either MODEL or --diff UNFUSED FUSED, not both")
    if not models:
        raise OnnxfuseError("no model given: 'onnxfuse view MODEL.onnx' (or --diff UNFUSED.onnx FUSED.onnx)")
    check_host(args.host, args.allow_remote)
    _netron()  # serving and screenshots both need it: say so before anything else happens

    if args.screenshot:
        if args.diff:
            raise OnnxfuseError("--screenshot takes one MODEL, not --diff; run it once per model")
        res = screenshot(models[0], args.screenshot, node=args.node, window=args.window, force=args.force,
                         sidebar=not args.no_sidebar, timeout=args.timeout)
        if getattr(args, "json", False):
            print(json.dumps({k: str(v) if isinstance(v, pathlib.Path) else v for k, v in res.items()}))
        elif not args.quiet:
            sel = f", {res['selected']} selected" if res["selected"] else ""
            print(f"wrote {res['path']} ({res['bytes'] // 1024} KB; {res['nodes_drawn']} nodes drawn, "
                  f"{res['fused_nodes']} onnxfuse nodes{sel})")
        return 0
    if args.node or args.no_sidebar:
        raise OnnxfuseError("--node and --no-sidebar go with --screenshot")

    for m in models:  # all inputs checked before anything is served
        _validate(m)
    if not block:
        return _serve_all(args, models, block=False)
    with _sigterm_exits():  # from before the URL is printed: a SIGTERM right after it still stops cleanly
        try:
            _serve_all(args, models, block=True)
            wait()
        except SystemExit as e:
            stop()
            return e.code if isinstance(e.code, int) else 0
    return 0


def _serve_all(args, models, *, block: bool) -> int:
    served: list[Served] = []
    try:
        for i, m in enumerate(models):
            port = None if args.port is None else (args.port + i if args.port else 0)
            served.append(serve(m, args.host, port, allow_remote=args.allow_remote, browse=not args.no_browser))
    except BaseException:
        for s in served:
            stop(s)
        raise
    if getattr(args, "json", False):
        labels = ["unfused", "fused"] if args.diff else ["model"]
        for s, label in zip(served, labels):
            print(json.dumps({"role": label, "path": str(s.path), "url": s.url, "host": s.host, "port": s.port,
                              "onnxfuse_nodes": list(s.fused_nodes)}), flush=True)
    elif not args.quiet:
        labels = ["unfused", "fused"] if args.diff else [None]
        for s, label in zip(served, labels):
            fused = f"{len(s.fused_nodes)} onnxfuse node{'s' if len(s.fused_nodes) != 1 else ''}"
            url = s.url if s.host not in ("0.0.0.0", "") else f"http://{socket.gethostname()}:{s.port}/"
            print(f"{label + ': ' if label else ''}serving {s.path} ({fused}) at {url}", flush=True)
        if not is_loopback(args.host):
            print(f"warning: listening on {args.host}: anyone who can reach it can read the model", flush=True)
        if block:
            print("press Ctrl-C to stop", flush=True)
    return 0


def register(subparsers, parser_class=None):
    """Add the `view` subcommand to the `onnxfuse` command line (cli.build_parser)."""
    v = subparsers.add_parser("view", help="show a model in Netron (served on 127.0.0.1), or screenshot it",
                              description="Serve a model with Netron on this machine and print its URL "
                                          "(Ctrl-C stops it); --diff shows a model before and after fusing; "
                                          "--screenshot writes a PNG with headless Chromium.")
    add_arguments(v)
    v.set_defaults(func=run)
    return v


def _parser():
    try:
        from .cli import _Parser as parser_class
    except ImportError:  # pragma: no cover
        import argparse
        parser_class = argparse.ArgumentParser
    p = parser_class(prog="onnxfuse view", description="Show a model in Netron, or screenshot it.")
    add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """`python -m onnxfuse.view ...`: the same as `onnxfuse view ...`."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    try:
        return run(args)
    except OnnxfuseError as e:
        print(f"onnxfuse: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
