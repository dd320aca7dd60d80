"""The package's layout (issues 17 and 29): modules and functions small enough to read, no import cycles, one
command line.

  * no module over 600 lines and no function over 80, except those named in LONG_FUNCTIONS with the reason;
  * no cycle among onnxfuse's modules, not even through imports inside functions (issue 29: fuse and ort_fusions,
    kernels and runtime once imported each other that way), and every module imports in a fresh interpreter;
  * the cli package is the command line: the only place that builds an argparse.ArgumentParser or defines main(),
    besides the bench package's `register(subparsers)`. `python -m onnxfuse` (__main__.py) runs cli.main.
"""
from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "onnxfuse"
MAX_LINES = 600
MAX_FUNCTION_LINES = 80
# "path:function" -> why it is longer (generated code, or code whose length is its job)
LONG_FUNCTIONS = {
    "onnxfuse/kernels/ops_header.py:render": "the template of the generated C++ header: its length is that header's",
}
# The bench package keeps the bench command's parser (bench/command.py: register(subparsers)), which the cli package
# calls.
BENCH = ("onnxfuse/bench/",)
# kernels/triton/ is no package (no __init__.py): Triton kernel sources and aot.py, which the CMake build runs as a
# script (`python aot.py --out ...`, its own argparse) to compile the kernels ahead of time.
BUILD_SCRIPTS = ("onnxfuse/kernels/triton/",)


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _files() -> list[pathlib.Path]:
    return sorted(PKG.rglob("*.py"))


def _modules() -> dict[str, pathlib.Path]:
    """Dotted name -> file of every module of the package (the build scripts of kernels/triton/ left out)."""
    out = {}
    for path in _files():
        rel = _rel(path)
        if rel.startswith(BUILD_SCRIPTS):
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def test_no_module_over_600_lines():
    too_long = [f"{_rel(p)}: {n} lines" for p in _files() if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not too_long, "split these: " + "; ".join(too_long)


def _long_functions() -> dict[str, int]:
    found = {}
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found[f"{_rel(path)}:{node.name}"] = lines
    return found


def test_no_function_over_80_lines_but_the_named_ones():
    found = _long_functions()
    unnamed = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS}
    assert not unnamed, f"split these, or name them in LONG_FUNCTIONS with the reason: {unnamed}"
    stale = [k for k in LONG_FUNCTIONS if k not in found]
    assert not stale, f"no longer long (take them out of LONG_FUNCTIONS): {stale}"


def _top_level_imports(tree: ast.Module):
    """Import statements that run when the module loads: at the top level, and in top-level if/try blocks."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            stack[:0] = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                         *(s for h in getattr(node, "handlers", []) for s in h.body)]


def _all_imports(tree: ast.Module):
    """Every import statement, inside functions too."""
    return (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


def import_graph(inside_functions: bool = False) -> dict[str, set[str]]:
    """module -> the onnxfuse modules its module-level imports (with inside_functions, all its imports) load.
    `from P import x` loads P.x when that is a module, else P; importing a.b also runs the __init__ of each package on
    the way that is not the importer's own (its own packages are already loading when it runs)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")) + 1)}
        edges: set[str] = set()

        def add(target: str) -> None:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # the packages on the way, then the module itself
                prefix = ".".join(parts[:i])
                if prefix in modules and prefix not in ancestors:
                    edges.add(prefix)

        tree = ast.parse(path.read_text())
        for node in (_all_imports(tree) if inside_functions else _top_level_imports(tree)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "onnxfuse":
                        add(alias.name)
                continue
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "onnxfuse":
                continue
            add(source)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    add(f"{source}.{alias.name}")
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (its modules in import order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_among_module_level_imports():
    graph = import_graph()
    assert "onnxfuse.kernels.build" in graph["onnxfuse.kernels"]  # the graph sees relative imports
    assert "onnxfuse.kernels.cache" in graph["onnxfuse.kernels.toolchain"]
    cycle = find_cycle(graph)
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_even_inside_functions():
    graph = import_graph(inside_functions=True)
    assert "onnxfuse.kernels" in graph["onnxfuse.runtime"]  # runtime imports the kernels inside a function
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle (imports inside functions included): " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_module_imports_cli():
    """The cli package sits on top: nothing but __main__.py imports it (view once did, for its parser class)."""
    users = [name for name, edges in import_graph().items()
             if "onnxfuse.cli" in edges and name != "onnxfuse.__main__" and not name.startswith("onnxfuse.cli")]
    # imports inside functions too (view once imported cli's parser class in one)
    spelled = re.compile(r"^\s*(from\s+(\.+|onnxfuse\.)cli\s+import|import\s+onnxfuse\.cli\b"
                         r"|from\s+(\.+|onnxfuse)\s+import\s+(.*,\s*)?cli\b)", re.M)
    for name, path in _modules().items():
        if name != "onnxfuse.__main__" and not name.startswith("onnxfuse.cli") and spelled.search(path.read_text()):
            users.append(name)
    assert not users, f"these modules import the cli package: {sorted(set(users))}"


def test_every_module_imports_in_a_fresh_interpreter():
    names = [n for n in _modules() if not n.endswith("__main__")]  # a __main__ runs the CLI
    code = ("import importlib, subprocess, sys\n"
            "bad = []\n"
            "for name in sys.argv[1:]:\n"
            "    p = subprocess.run([sys.executable, '-c', f'import {name}'], capture_output=True, text=True)\n"
            "    if p.returncode:\n"
            "        bad.append(name + ': ' + (p.stderr.strip().splitlines() or ['?'])[-1])\n"
            "print('\\n'.join(bad))\n")
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr


def _builds_a_parser(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "ArgumentParser" or
               isinstance(n, ast.Name) and n.id == "ArgumentParser" for n in ast.walk(tree))


@pytest.mark.parametrize("what", ["ArgumentParser", "main()"])
def test_cli_is_the_only_command_line(what):
    found = []
    for path in _files():
        rel = _rel(path)
        if rel == "onnxfuse/__main__.py" or rel.startswith(("onnxfuse/cli/",) + BENCH + BUILD_SCRIPTS):
            continue
        tree = ast.parse(path.read_text())
        if what == "ArgumentParser" and _builds_a_parser(tree):
            found.append(rel)
        if what == "main()" and any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            found.append(rel)
    assert not found, f"{what} outside the cli package (its options belong in its parsers): {found}"


def test_python_dash_m_onnxfuse_is_the_cli():
    r = subprocess.run([sys.executable, "-m", "onnxfuse", "doctor", "--help"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage: onnxfuse doctor") and "--providers" in r.stdout


def test_ops_are_named_only_by_their_family_and_the_registry():
    """Issue 29: an op family is one Python unit. Only its module (onnxfuse/ops/<family>.py) and the registry
    (onnxfuse/schema.py, which builds OPS from onnxfuse/ops/) spell an op's name; everything else (functions,
    testing, doctor, the rules' opset guard, tune, fuse's patterns) asks the registry (`schema.op_def(op)`,
    `schema.FAMILY_OF`), and a rule names the op it emits through its family's schema object
    (`ops.swiglu.SWIGLU.name`). A string literal exactly equal to an op name anywhere else in the package is an op
    listed by hand, and fails here. Allow-list (path -> why) empty: no literal is needed. Prose (docstrings,
    messages) that mentions an op inside longer text is fine; the kernel library's C++ is out of scope."""
    from onnxfuse import schema

    allowed: dict[str, str] = {}
    found = []
    for path in _files():
        rel = _rel(path)
        if rel == "onnxfuse/schema.py" or rel.startswith("onnxfuse/ops/") or rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in schema.OPS:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "ops named outside their family module (onnxfuse/ops/) and schema.py: " + "; ".join(found)


# Where an op family lives, one snake name in every layer (docs/adding-an-op.md: the files a new family adds).
FAMILY_FILES = ("onnxfuse/ops/{f}.py", "onnxfuse/rewrites/{f}.py", "tests/rewrites/test_{f}.py",
                "onnxfuse/kernels/cpu/{f}.cc", "onnxfuse/kernels/cuda/{f}.cu", "onnxfuse/kernels/triton/{f}.py")


def test_every_family_has_one_name_in_every_layer():
    """Issue 29: each family of onnxfuse.ops.FAMILIES has its rule, its tests, its CPU kernel, its CUDA side (the
    kernels, the CUDA EP glue and the Triton launcher in one .cu) and its Triton kernel under its own name, and
    nothing is found from a hand-kept list: fuse finds the rule module by the family's name, the kernel library's
    registration comes from the generated ONNXFUSE_OP_FAMILIES, CMake globs each folder, and aot.py and the
    generated header number the kernels of every triton/*.py that has a KERNELS table (triton/table.py) and compile
    the tiles of its CONFIGS."""
    from onnxfuse import fuse
    from onnxfuse.ops import FAMILIES

    names = [family.name for family in FAMILIES]
    missing = [p.format(f=f) for f in names for p in FAMILY_FILES if not (ROOT / p.format(f=f)).is_file()]
    assert not missing, "family files missing: " + ", ".join(missing)
    assert list(fuse.PATTERNS) == names
    assert all(fuse.PATTERNS[f].__module__ == f"onnxfuse.rewrites.{f}" for f in names)
    # the Python layers hold nothing but families (and private helpers, _name.py); the kernel folders also hold the
    # shared pieces (cpu/gemm.cc, cuda/gemm.cu, triton/gemm_loop.py, ...)
    orphans = [_rel(path) for pattern in FAMILY_FILES[:3] for path in ROOT.glob(pattern.replace("{f}", "*"))
               if path.name != "__init__.py" and not path.name.startswith("_")
               and path.name.removeprefix("test_").removesuffix(".py") not in names]
    assert not orphans, "files of no family: " + ", ".join(orphans)
    table = _triton_table()
    assert set(table.KERNEL_FILES) == set(names), "every family has a Triton kernel file with a KERNELS table"


def _triton_table():
    import importlib.util
    spec = importlib.util.spec_from_file_location("_table", PKG / "kernels/triton/table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
