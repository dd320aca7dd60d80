"""`onnxfuse view`: look at a (fused) model in Netron, served from this machine, and screenshot it headlessly.

    onnxfuse view model.fused.onnx                      # serve on 127.0.0.1, open a browser, Ctrl-C to stop
    onnxfuse view --diff model.onnx model.fused.onnx    # both models, two ports, side by side
    onnxfuse view --screenshot out.png model.fused.onnx # PNG of the first fused node, its properties in the sidebar

Two modules: serve.py serves models with the `netron` package's server (loopback unless --allow-remote);
screenshot.py renders one in headless Chromium over the DevTools protocol and writes a PNG. This package holds the
command (`run`, called by the cli package with the parsed arguments) and re-exports both modules' API.
"""
from __future__ import annotations

import json
import pathlib
import socket

from ..errors import OnnxfuseError
from .screenshot import (CHROMIUM, CHROMIUM_FLAGS, DEFAULT_WINDOW, INSTALL_HINT, Headless, dom, find_chromium,
                         open_netron, screenshot)
from .serve import (DEFAULT_HOST, DOMAIN, Served, check_host, is_loopback, netron_module, serve, sigterm_exits, stop,
                    validate, wait)

__all__ = ["register", "CHROMIUM", "CHROMIUM_FLAGS", "DEFAULT_HOST", "DEFAULT_WINDOW", "DOMAIN", "INSTALL_HINT",
           "Headless",
           "OnnxfuseError", "Served", "check_host", "dom", "find_chromium", "is_loopback", "open_netron", "run",
           "screenshot", "serve", "stop", "wait"]


def run(args, *, block: bool = True) -> int:
    """The `view` command. block=False returns as soon as the server(s) run (stop them with view.stop())."""
    models = list(args.diff) if args.diff else ([args.model] if args.model else [])
    models = [_decoder_of(m) for m in models]
    if args.diff and args.model:
        raise OnnxfuseError("give either MODEL or --diff UNFUSED FUSED, not both")
    if not models:
        raise OnnxfuseError("no model given: 'onnxfuse view MODEL.onnx' (or --diff UNFUSED.onnx FUSED.onnx)")
    check_host(args.host, args.allow_remote)
    netron_module()  # serving and screenshots both need it: say so before anything else happens

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
        validate(m)
    if not block:
        return _serve_all(args, models, block=False)
    with sigterm_exits():  # from before the URL is printed: a SIGTERM right after it still stops cleanly
        try:
            _serve_all(args, models, block=True)
            wait()
        except SystemExit as e:
            stop()
            return e.code if isinstance(e.code, int) else 0
    return 0


def _decoder_of(path: str) -> str:
    """A genai model folder's decoder model (what its genai_config.json names); any other path as given."""
    if pathlib.Path(path).is_dir():
        from ..genai import folder
        return str(folder.decoder_path(pathlib.Path(path)))
    return path


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


def register(sub) -> None:
    """The `view` command's parser under the cli package's subparsers; `run(args)` does the work."""
    from ..argtypes import port as _port, window_size as _window
    v = sub.add_parser("view", help="show a model in Netron (served on 127.0.0.1), or screenshot it",
                       description="Serve a model with Netron on this machine and print its URL (Ctrl-C stops it); "
                                   "--diff shows a model before and after fusing; --screenshot writes a PNG with "
                                   "headless Chromium.")
    v.add_argument("model", nargs="?", metavar="MODEL",
                   help="the .onnx model to show, or a genai model folder (its decoder)")
    v.add_argument("--diff", nargs=2, metavar=("UNFUSED", "FUSED"),
                   help="serve two models (e.g. before and after 'onnxfuse fuse') on two ports")
    v.add_argument("--port", type=_port, help="port to serve on (default: 8080 if free, else another; "
                   "with --diff the second model gets PORT+1; 0: any free port)")
    v.add_argument("--host", default=DEFAULT_HOST, help=f"address to serve on (default {DEFAULT_HOST}; "
                   "a non-loopback address needs --allow-remote)")
    v.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host (the model and the files beside it become readable there)")
    v.add_argument("--no-browser", action="store_true", help="do not open a web browser; just print the URL")
    v.add_argument("--screenshot", "-o", metavar="PNG",
                   help="render the model in headless Chromium, write this PNG and exit (no server left running)")
    v.add_argument("--node", help="with --screenshot: the node to center and select (default: the first onnxfuse node)")
    v.add_argument("--window", type=_window, default=DEFAULT_WINDOW, metavar="WxH",
                   help="with --screenshot: the browser window in pixels (default 1600x1000)")
    v.add_argument("--no-sidebar", action="store_true", help="with --screenshot: leave out the node's properties")
    v.add_argument("--timeout", type=float, default=60.0,
                   help="with --screenshot: seconds to wait for Netron (default 60)")
    v.add_argument("--force", action="store_true", help="with --screenshot: overwrite an existing PNG")
    v.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    v.add_argument("--json", action="store_true",
                   help="print JSON: the screenshot's summary, or one line per served model with its URL")
    v.set_defaults(func=run)
