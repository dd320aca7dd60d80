"""`onnxfuse view`: Netron serving a fused model, the graph as headless Chromium draws it, screenshots, bad input.

Chromium comes from scripts/install_chromium.sh (Debian's package) when it is missing and apt can run; the tests that
need it are skipped, saying why, only where it cannot be installed.
"""
from __future__ import annotations

import html.parser
import os
import pathlib
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request

import pytest

from onnxfuse import view

ROOT = pathlib.Path(__file__).resolve().parents[1]
INSTALL = ROOT / "scripts" / "install_chromium.sh"
URL_LINE = re.compile(r"serving (?P<path>\S+) \((?P<fused>\d+) onnxfuse nodes?\) at (?P<url>http://127\.0\.0\.1:\d+/)")


def _command() -> list[str]:
    """`python -m onnxfuse view` (onnxfuse/__main__.py, the same parser as the `onnxfuse` script)."""
    return [sys.executable, "-m", "onnxfuse", "view"]


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


def _run(*args, timeout=120, **env):
    return subprocess.run([*_command(), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=_env(**env), cwd=ROOT)


@pytest.fixture(scope="session")
def chromium() -> str:
    try:
        return view.find_chromium()
    except Exception:
        pass
    if os.environ.get("ONNXFUSE_CHROMIUM"):
        pytest.skip(f"ONNXFUSE_CHROMIUM={os.environ['ONNXFUSE_CHROMIUM']} is not an executable Chromium")
    if not shutil.which("apt-get"):
        pytest.skip("headless Chromium is missing and apt-get is not available to install it "
                    "(install Chromium and set ONNXFUSE_CHROMIUM)")
    can_root = os.geteuid() == 0 or (shutil.which("sudo") and
                                     subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0)
    if not can_root:
        pytest.skip("headless Chromium is missing and installing it needs root: run 'sudo scripts/install_chromium.sh'")
    r = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"scripts/install_chromium.sh could not install Chromium (exit {r.returncode}: {tail[0]})")
    return view.find_chromium()


@pytest.fixture(scope="session")
def fused_llama(exported, tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path, list[str]]:
    """(unfused, fused, names of the fused nodes) for a 1-layer tiny Llama."""
    import onnx

    from onnxfuse import fuse
    src = exported("llama", num_hidden_layers=1)
    out = tmp_path_factory.mktemp("view") / "llama-tiny.fused.onnx"
    fuse.fuse(src, out, force=True)
    names = [n.name for n in onnx.load(str(out), load_external_data=False).graph.node if n.domain == "onnxfuse"]
    assert names, "the tiny Llama should fuse (SwiGLU)"
    return src, out, names


class _Server:
    """`onnxfuse view --no-browser` in a subprocess; the URLs it prints."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([*_command(), "--no-browser", "--port", "0", *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
        self.lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"view exited early (rc {self.proc.wait()}): {self.proc.stderr.read()}")
            self.lines.append(line.rstrip("\n"))
            if line.startswith("press Ctrl-C"):
                return
        raise AssertionError(f"view printed no URL within 60 s: {self.lines}")

    @property
    def matches(self):
        return [m for m in map(URL_LINE.search, self.lines) if m]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.stdout.close()
            self.proc.stderr.close()


class _Graph(html.parser.HTMLParser):
    """Netron's SVG graph: for each <g id="node-name-NAME" class="node graph-node">, the texts drawn in it
    (op type first, then argument rows such as 'backend', ' = auto') and its <title> tooltips (the node name)."""

    def __init__(self):
        super().__init__()
        self.nodes: dict[str, dict[str, list[str]]] = {}
        self._stack: list[str | None] = []  # for each open <g>: the node it opens, or None
        self._tag = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "g":
            node_id = a.get("id") or ""
            is_node = node_id.startswith("node-name-") and "graph-node" in (a.get("class") or "")
            self._stack.append(node_id[len("node-name-"):] if is_node else None)
            if is_node:
                self.nodes[self._stack[-1]] = {"text": [], "title": []}
        self._tag = tag

    def handle_endtag(self, tag):
        if tag == "g" and self._stack:
            self._stack.pop()
        self._tag = None

    def handle_data(self, data):
        current = next((n for n in reversed(self._stack) if n is not None), None)
        if current is None or not data.strip():
            return
        if self._tag in ("text", "tspan"):
            self.nodes[current]["text"].append(data)
        elif self._tag == "title":
            self.nodes[current]["title"].append(data)


def test_serve_and_render_fused_graph(chromium, fused_llama):
    _, fused, names = fused_llama
    server = _Server(fused)
    try:
        [m] = server.matches
        assert int(m["fused"]) == len(names)
        url = m["url"]
        # Netron's page, pointing at the model, and the model's bytes
        page = urllib.request.urlopen(url, timeout=10).read().decode()
        assert f'<meta name="file" content="/data/{fused.name}">' in page
        assert urllib.request.urlopen(f"{url}data/{fused.name}", timeout=10).read() == fused.read_bytes()

        dom = view.dom(url, timeout=45)
    finally:
        assert server.stop() == 0, "view should stop cleanly (exit 0) on SIGTERM"
    graph = _Graph()
    graph.feed(dom)
    assert len(graph.nodes) > 20, f"Netron drew {len(graph.nodes)} nodes; expected the whole graph"
    for name in names:
        assert name in graph.nodes, f"fused node {name} not drawn; drawn: {sorted(graph.nodes)[:10]}..."
        node = graph.nodes[name]
        op = {"rotary_embedding": "RotaryEmbedding", "embedding": "Embedding"}.get(name.split("/")[1], "SwiGLU")
        assert node["text"][0] == op, node                # the op type is the node's label
        assert name in node["title"], node                 # the node name is its tooltip
        assert "backend" in node["text"] and " = auto" in node["text"], node  # attributes shown (option on)
    with pytest.raises(OSError):  # the server is gone (refused, or reset)
        urllib.request.urlopen(url, timeout=5)


def test_diff_serves_each_model_on_its_own_port(fused_llama):
    src, fused, _ = fused_llama
    server = _Server("--diff", src, fused)
    try:
        found = server.matches
        assert [pathlib.Path(m["path"]).name for m in found] == [src.name, fused.name]
        assert [int(m["fused"]) for m in found][0] == 0 and int(found[1]["fused"]) > 0
        assert found[0]["url"] != found[1]["url"]
        for m, path in zip(found, (src, fused)):  # netron alone would serve the last model on both ports
            page = urllib.request.urlopen(m["url"], timeout=10).read().decode()
            assert f'<meta name="file" content="/data/{path.name}">' in page
    finally:
        assert server.stop() == 0


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_screenshot_writes_png(chromium, fused_llama, tmp_path):
    _, fused, names = fused_llama
    out = tmp_path / "fused.png"
    r = _run("--screenshot", out, "--window", "1200x800", fused)
    assert r.returncode == 0, r.stderr
    assert f"{names[0]} selected" in r.stdout
    data = out.read_bytes()
    assert len(data) > 10_000, f"PNG of {len(data)} bytes: blank page?"
    assert _png_size(data) == (1200, 800)
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(out) as im:  # a drawn graph and a filled sidebar, not a blank or single-colour page
        colors = im.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colors is None or len(colors) > 50
    r = _run("--screenshot", out, fused)  # no silent overwrite
    assert r.returncode == 2 and "--force" in r.stderr


def test_bad_input_exits_2_with_one_line(tmp_path):
    cases = [
        ((tmp_path / "missing.onnx",), "no such file"),
        (("--host", "0.0.0.0", "--no-browser", tmp_path / "missing.onnx"), "--allow-remote"),
        (("--host", "10.1.2.3", "--no-browser", tmp_path / "missing.onnx"), "--allow-remote"),
        ((), "no model given"),
        (("--port", "70000", "m.onnx"), "port"),
    ]
    for args, words in cases:
        r = _run(*args, timeout=60)
        assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("onnxfuse: error:") and words in lines[0], (args, r.stderr)
        assert r.stdout == ""


def test_refusals_before_serving(fused_llama, tmp_path):
    _, fused, _ = fused_llama
    # Chromium missing: the error says how to install it
    r = _run("--screenshot", tmp_path / "x.png", fused, timeout=60, ONNXFUSE_CHROMIUM=str(tmp_path / "no-chromium"))
    assert r.returncode == 2 and "scripts/install_chromium.sh" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "x.png").exists()
    # a port already taken
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = _run("--no-browser", "--port", s.getsockname()[1], fused, timeout=60)
    assert r.returncode == 2 and "--port" in r.stderr and len(r.stderr.splitlines()) == 1


def test_host_policy():
    for host in ("127.0.0.1", "localhost", "127.0.0.2"):
        view.check_host(host)
    for host in ("0.0.0.0", "192.168.1.5", "example.com"):
        with pytest.raises(view.OnnxfuseError, match="--allow-remote"):
            view.check_host(host)
        view.check_host(host, allow_remote=True)


def test_api_serve_returns_at_once(fused_llama):
    _, fused, names = fused_llama
    served = view.serve(fused, port=0)
    try:
        assert served.fused_nodes == names
        page = urllib.request.urlopen(served.url, timeout=10).read().decode()
        assert f"/data/{fused.name}" in page
    finally:
        view.stop(served)
    with pytest.raises(OSError):  # refused, or reset
        urllib.request.urlopen(served.url, timeout=5)
