"""Headless screenshots of a model in Netron: a small Chrome DevTools protocol client for Chromium.

Drives Debian's /usr/bin/chromium (or $ONNXFUSE_CHROMIUM) headless over the DevTools protocol on a pipe
(--remote-debugging-pipe; no port is opened). The plain `chromium --screenshot URL` cannot show a Netron graph: in a
fresh profile Netron first asks for cookie consent (it looks the country up on ipinfo.io, which fails offline, so it
asks) and waits for a click. Over the protocol we set that cookie in a throw-away profile, turn on Netron's
"show attributes" option, wait until the graph is drawn, select the fused node and capture the window. The model is
served for the shot by serve.py, on a free loopback port, and stopped afterwards.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

from .. import onnxio
from ..errors import OnnxfuseError
from .serve import DEFAULT_HOST, serve, stop

CHROMIUM = "/usr/bin/chromium"
INSTALL_HINT = "install it with 'scripts/install_chromium.sh' (or 'apt-get install chromium'), " \
               "or set ONNXFUSE_CHROMIUM to a Chromium/Chrome binary"
DEFAULT_WINDOW = (1600, 1000)
# Flags for a closed network: nothing in the background may try to reach the internet (and stall the page).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-default-apps", "--disable-extensions", "--hide-scrollbars", "--mute-audio"]


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
                 {"source": f"try {{ localStorage.setItem('options', {json.dumps(json.dumps(options))}); }} "
                            "catch (e) {}"})
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
    raise OnnxfuseError(f"Netron did not draw the graph within {timeout:.0f} s; "
                        "try a smaller model or a longer --timeout")


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
    onnxio.write_atomic(out, data)
    return {"path": str(out), "bytes": len(data), "nodes_drawn": count, "fused_nodes": len(served.fused_nodes),
            "selected": (shown or "").removeprefix("node-name-") or None}


def _all_node_names(path) -> set[str]:
    return {n.name for n in onnxio.load(path, load_external_data=False).graph.node}
