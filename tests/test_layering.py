"""The shape of the code: imports flow one way (dataset_bench -> packer -> readers -> readers.contract), the
packages are layers that import only the ones below them (LAYERS), no
import cycle anywhere in ``packer/``, ``readers/`` and ``dataset_bench/`` (function-level imports
included), and no module reads another module's ``_private`` names.

An AST scan of the source files: nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("packer", "readers", "dataset_bench")


def _modules(packages=PACKAGES) -> dict[str, Path]:
    out = {}
    for pkg in packages:
        base = ROOT / pkg
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts).removesuffix(".__init__")] = path
    return out


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module name an ``ImportFrom`` names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """(target module, names imported from it, line) for every import statement, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(name, node, path.name == "__init__.py")
            out.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (module level or inside functions).

    ``from pkg import sub`` counts as importing ``pkg.sub``; importing a package's ``__init__`` for
    one of its names (``from packer import PackError``) is not an edge to every module that
    ``__init__`` imports: only to the package module itself, and package roots are left out (they
    are re-export lists, loaded before any of their modules)."""
    roots = set(PACKAGES)
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for target, names, _ in _imports(name, path, modules):
            candidates = [target] + [f"{target}.{n}" for n in names]
            deps |= {t for t in candidates if t in modules and t not in roots and t != name}
        edges[name] = deps
    return edges


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan), i.e. every cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_cycle_scan_finds_a_function_level_cycle(tmp_path):
    """The scan itself: a cycle closed only by an import inside a function is found."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import b\n")
    b.write_text("def f():\n    from a import x\n")
    modules = {"a": a, "b": b}
    assert cycles(import_graph(modules)) == [frozenset({"a", "b"})]


def test_no_import_cycles_in_packer_readers_bench():
    modules = _modules()
    assert {"packer.cli", "readers.contract.spec"} <= set(modules), "the scan must see the packages"
    found = [sorted(c) for c in cycles(import_graph(modules))]
    assert not found, f"import cycles (function-level imports included): {found}"


#: The packages of each layer and what each may import (besides itself and the standard library). The
#: top-level modules of ``packer`` (api, cli, errors, options, output, journal, pipeline, remote_output: the
#: pack itself) are units of their own.
LAYERS = {
    "readers.contract": set(),
    "readers.remote": {"readers.contract"},
    "readers.decode": {"readers.contract"},
    "readers.order": {"readers.contract"},
    "readers.formats": {"readers.contract", "readers.remote", "readers.decode", "readers.order"},
    "readers.loader": {"readers.contract", "readers.remote", "readers.decode", "readers.order", "readers.formats"},
    "packer.sources": {"packer.errors", "readers.contract"},
    "packer.prepare": {"packer.errors", "packer.sources", "readers.contract", "readers.decode"},
    "packer.importers": {"packer.errors", "packer.options", "packer.prepare", "packer.sources", "readers.contract",
                         "readers.remote"},
    "packer.formats": {"packer.errors", "packer.options", "packer.output", "packer.prepare", "readers.contract",
                       "readers.formats"},
}
#: What ``packer`` may import of ``readers``: never the order or the loader (torch's DataLoader machinery).
PACKER_MAY_IMPORT = {"readers.contract", "readers.decode", "readers.formats", "readers.remote"}


def unit(module: str) -> str:
    """The layer unit a module belongs to: its package under ``readers``/``packer``, else itself."""
    parts = module.split(".")
    head = ".".join(parts[:2])
    return head if len(parts) >= 2 and head in _package_names() else module


def _package_names() -> set[str]:
    return {".".join(p.relative_to(ROOT).parts[:-1])
            for pkg in ("readers", "packer") for p in (ROOT / pkg).glob("*/__init__.py")}


def unit_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for mod, deps in edges.items():
        out.setdefault(unit(mod), set()).update(unit(d) for d in deps if unit(d) != unit(mod))
    return out


def test_every_package_imports_only_the_layers_below_it():
    """The folders are the layers: each package of ``readers`` and ``packer`` imports only what LAYERS allows,
    every package is in LAYERS or is a top layer (``packer.engines``, ``packer.tools``), and each says in its
    ``__init__`` docstring what it owns."""
    edges = import_graph(_modules())
    graph = unit_graph(edges)
    packages = _package_names()
    assert {"readers.contract", "readers.decode", "readers.order", "readers.formats", "readers.loader",
            "readers.remote", "packer.sources", "packer.prepare", "packer.tools"} <= packages
    assert packages - set(LAYERS) == {"packer.engines", "packer.tools"}, packages - set(LAYERS)
    for pkg, allowed in LAYERS.items():
        assert graph.get(pkg, set()) <= allowed, f"{pkg} imports {sorted(graph[pkg] - allowed)}"
    for pkg in packages:
        doc = ast.get_docstring(ast.parse((ROOT / pkg.replace(".", "/") / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"{pkg}/__init__.py says what it owns"
    # the top layers: in packer only the CLI reaches the tools; nothing in readers imports the loader but itself
    assert {u for u, deps in graph.items() if "packer.tools" in deps and u.startswith("packer")} <= {"packer.cli"}
    assert {u for u, deps in graph.items() if "readers.loader" in deps and u.startswith("readers")} <= {"readers"}


def test_imports_flow_one_way():
    """readers never imports packer or dataset_bench; packer never imports dataset_bench and of readers only
    the contract, the decode stack, the formats and the remote stores; inside the contract, the bottom
    modules (locations, safe I/O, messages, the environment) import nothing of the project."""
    edges = import_graph(_modules())
    for mod, deps in edges.items():
        if mod.startswith("readers"):
            assert not {d for d in deps if d.startswith(("packer", "dataset_bench"))}, mod
        if mod.startswith("packer"):
            assert not {d for d in deps if d.startswith("dataset_bench")}, mod
            reached = {unit(d) for d in deps if d.startswith("readers")}
            assert reached <= PACKER_MAY_IMPORT, f"{mod} imports {sorted(reached - PACKER_MAY_IMPORT)}"
    contract = {m for m in edges if m.startswith("readers.contract.")}
    own = {m: edges[m] - {"readers.contract"} for m in contract}
    for m in ("location", "safeio", "env", "messages", "perprocess", "units"):
        assert own[f"readers.contract.{m}"] == set(), f"readers.contract.{m} imports {own[f'readers.contract.{m}']}"
    assert own["readers.contract.checkcache"] <= {"readers.contract.safeio"}  # records written with atomic_write
    assert "readers.loader.dataloader" not in edges["readers.loader.shmring"]


def test_the_contract_imports_no_torch():
    """``packer`` and the tools import the contract without paying for torch: importing every module of
    ``readers.contract`` (and ``packer``'s own modules that only write) loads no torch."""
    import subprocess
    import sys
    mods = sorted(m for m in _modules() if m.startswith("readers.contract"))
    code = ("import importlib, sys\n"
            f"for m in {mods!r} + ['packer.sources.source', 'packer.prepare.images']: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def private_reads(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    """``from mod import _name`` and ``mod._name`` (``mod`` an imported project module) across modules
    (``monkeypatch.setattr(mod, "_name", ...)`` spells the name as a string: not seen)."""
    known = set(modules) | set(PACKAGES)
    out = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(root)
        aliases: dict[str, str] = {}  # local name -> project module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _absolute(name, node, path.name == "__init__.py")
                if target.split(".")[0] not in PACKAGES:
                    continue
                for a in node.names:
                    if f"{target}.{a.name}" in known:
                        aliases[a.asname or a.name] = f"{target}.{a.name}"
                    elif a.name.startswith("_") and not a.name.startswith("__") and target != name:
                        out.append(f"{where}:{node.lineno}: from {target} import {a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in known:
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and aliases[node.value.id] != name):
                out.append(f"{where}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return out


def test_private_scan_finds_private_reads(tmp_path):
    """The scan itself: both spellings are found, public names and a module's own privates are not."""
    (tmp_path / "packer").mkdir()
    (tmp_path / "readers").mkdir()
    (tmp_path / "packer" / "m.py").write_text(
        "from readers.spec import _hidden, public\nfrom readers import spec\nx = spec._other\ny = spec.public\n")
    (tmp_path / "readers" / "spec.py").write_text("_hidden = 1\n_other = 2\npublic = 3\nz = _hidden\n")
    modules = {"packer.m": tmp_path / "packer" / "m.py", "readers.spec": tmp_path / "readers" / "spec.py"}
    lines = private_reads(modules, tmp_path)
    assert [line.split(": ", 1)[1] for line in lines] == ["from readers.spec import _hidden", "readers.spec._other"]


def test_no_module_or_test_reads_another_modules_private_names():
    tests = {f"tests.{p.stem}": p for p in sorted((ROOT / "tests").glob("*.py"))}
    found = private_reads({**_modules(), **tests})
    assert not found, "modules read other modules' _private names:\n" + "\n".join(found)
