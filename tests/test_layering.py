"""Layering rules, checked on the source (ast), so a violation fails here before it ships:

* the agent (edgekit.agent) imports only the standard library and itself at import time;
  inside functions it may also import numpy and the backend runtimes; never the host;
* nothing imports edgekit.cli except the CLI itself and edgekit/__main__.py;
* only edgekit/cli/output.py imports rich.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edgekit"
AGENT = PACKAGE / "agent"
LAZY_OK = {"numpy", "onnxruntime", "openvino", "tflite_runtime", "ai_edge_litert"}
STDLIB = set(sys.stdlib_module_names)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[tuple[str, bool, int]]:
    """Yield (absolute module imported, at module level?, line) for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST, top: bool) -> Iterator[tuple[str, bool, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, top, child.lineno
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                yield target, top, child.lineno
                # `from pkg import mod` imports pkg.mod when mod is a submodule
                for alias in child.names:
                    yield f"{target}.{alias.name}", top, child.lineno
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from visit(child, inner)

    yield from visit(tree, True)


def _py_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("path", _py_files(AGENT), ids=_rel)
def test_agent_imports_only_stdlib_and_itself(path):
    bad = []
    for module, top, line in _imports(path):
        root = module.split(".")[0]
        if _is_under(module, "edgekit.agent"):
            continue
        if root == "edgekit":
            bad.append(f"{_rel(path)}:{line} imports the host ({module}); the agent runs without it")
        elif root in STDLIB or module == "__future__":
            continue
        elif top:
            bad.append(f"{_rel(path)}:{line} imports {module} at module level; import it inside the function")
        elif root not in LAZY_OK:
            bad.append(f"{_rel(path)}:{line} imports {module}, which is not a known runtime")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", _py_files(AGENT), ids=_rel)
def test_agent_parses_as_python_37(path):
    # Boards run old interpreters; the zip's boot stub answers in JSON below 3.7.
    ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=(3, 7))


def test_the_agent_is_found():
    names = {_rel(p) for p in _py_files(AGENT)}
    assert {"edgekit/agent/__main__.py", "edgekit/agent/runner.py", "edgekit/agent/facts.py"} <= names


def test_nothing_imports_the_cli():
    bad = []
    for path in _py_files(PACKAGE):
        rel = _rel(path)
        if rel.startswith("edgekit/cli/") or rel == "edgekit/__main__.py":
            continue
        for module, _, line in _imports(path):
            if _is_under(module, "edgekit.cli"):
                bad.append(f"{rel}:{line} imports {module}")
    assert not bad, "only the CLI may import edgekit.cli:\n" + "\n".join(bad)


def test_only_output_imports_rich():
    bad = []
    for path in _py_files(PACKAGE):
        if _rel(path) == "edgekit/cli/output.py":
            continue
        for module, _, line in _imports(path):
            if module.split(".")[0] == "rich":
                bad.append(f"{_rel(path)}:{line} imports {module}")
    assert not bad, "only edgekit/cli/output.py may import rich:\n" + "\n".join(bad)


def test_the_checker_sees_violations(tmp_path, monkeypatch):
    # The rules above are only as good as _imports: check it catches each kind of import.
    pkg = tmp_path / "edgekit" / "agent"
    pkg.mkdir(parents=True)
    src = pkg / "mod.py"
    src.write_text(
        "import json\nimport numpy\nfrom edgekit.errors import X\nfrom . import facts\nfrom .. import cli\n"
        "class K:\n    import rich.table\n"
        "def f():\n    import onnxruntime\n    from .backends import onnxruntime as b\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "edgekit")
    found = {(m, top) for m, top, _ in _imports(src)}
    assert {
        ("json", True),
        ("numpy", True),
        ("edgekit.errors", True),
        ("edgekit.agent.facts", True),
        ("edgekit.cli", True),
        ("rich.table", True),
        ("onnxruntime", False),
        ("edgekit.agent.backends.onnxruntime", False),
    } <= found


# -- the layer order and no cycles ----------------------------------------------------------------
# Lower layers never import higher ones (at module level or inside a function). The agent runs on
# the device and imports nothing from the host (checked above), so any host layer may read it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("edgekit", "edgekit.errors", "edgekit.fsutil", "edgekit.events", "edgekit.jsonable", "edgekit.agent", "edgekit._ekrt"),
    ("edgekit.profiles",),
    ("edgekit.tensorspec", "edgekit.modelio", "edgekit.modelio_tflite"),
    ("edgekit.quantize",),
    ("edgekit.targets",),
    ("edgekit.bundle",),
    ("edgekit.transport",),
    ("edgekit.transport.push", "edgekit.transport.agentzip"),
    ("edgekit.agentclient", "edgekit.bench", "edgekit.report", "edgekit.versions"),
    ("edgekit.devices",),
    ("edgekit.plan",),
    ("edgekit.deploy", "edgekit.api", "edgekit.ansibledeploy"),
    ("edgekit.ci", "edgekit.lava"),
    ("edgekit.cli", "edgekit.__main__"),
)


def _layer(module: str) -> int | None:
    """The layer of ``module``: the most specific prefix listed wins (edgekit.transport.push over edgekit.transport)."""
    best, best_len = None, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if _is_under(module, name) and len(name) > best_len:
                best, best_len = i, len(name)
    return best


def _host_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _py_files(PACKAGE)}


def _edges() -> dict[str, set[tuple[str, int]]]:
    """module -> {(imported edgekit module, line)}, resolving `from pkg import name` to pkg.name when that is a module."""
    modules = _host_modules()
    edges: dict[str, set[tuple[str, int]]] = {}
    for module, path in modules.items():
        out: set[tuple[str, int]] = set()
        for imported, _, line in _imports(path):
            if imported.split(".")[0] != "edgekit":
                continue
            if imported in modules:
                out.add((imported, line))
            elif imported.rpartition(".")[0] in modules:  # `from edgekit.x import function`
                out.add((imported.rpartition(".")[0], line))
        out.discard((module, 0))
        edges[module] = {(m, line) for m, line in out if m != module}
    return edges


def test_every_host_module_has_a_layer():
    missing = [m for m in _host_modules() if _layer(m) is None]
    assert not missing, "add these modules to LAYERS in tests/test_layering.py: " + ", ".join(missing)


def test_no_module_imports_a_higher_layer():
    modules = _host_modules()
    bad = []
    for module, targets in _edges().items():
        for imported, line in sorted(targets):
            if _layer(imported) > _layer(module):
                bad.append(f"{_rel(modules[module])}:{line} ({LAYERS[_layer(module)][0]}) imports {imported} ({LAYERS[_layer(imported)][0]})")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    # A package's __init__ re-exporting its submodules is not a cycle of modules; leave those edges out.
    graph = {
        m: {t for t, _ in targets if not (m.startswith(t + ".") and _host_modules()[t].name == "__init__.py")}
        for m, targets in _edges().items()
    }
    cycles = _cycles(graph)
    assert not cycles, "import cycles (lazy imports count):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_cli_spells_the_calibration_methods_as_the_quantizer_does():
    from edgekit.cli import common
    from edgekit.quantize.calib import DEFAULT_METHOD, METHODS

    assert common.METHODS == METHODS and common.DEFAULT_METHOD == DEFAULT_METHOD


def test_the_cli_starts_without_the_quantizer():
    # `edgekit --help`, `results`, `profiles`, `devices`: no onnx import on the way (start-up time)
    import subprocess

    code = "import sys; from edgekit.cli import _register; _register(); print(sorted(m for m in ('onnx', 'onnxruntime', 'edgekit.quantize') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
