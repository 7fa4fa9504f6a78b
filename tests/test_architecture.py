"""The import graph of the package, read from its source with ``ast`` (nothing is imported or run): no import circles,
no private name imported across modules, and layers that only point down; and the module map of docs/architecture.md
("Modules") lists every module in its layer, the layers in this order.

Imports inside functions count too: a lazy import is still an arrow.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "diffmem"
PACKAGE = PACKAGE_DIR.name

# The layers, from the bottom up. A module may import from its own layer and the layers below it, never from one above.
# Each entry names a module or a package; a package covers its modules, except those a longer entry names.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("diffmem", "diffmem.io", "diffmem.config", "diffmem.outcomes", "diffmem.eval_grid")),
    ("building blocks", ("diffmem.device", "diffmem.acceleration", "diffmem.data", "diffmem.model",
                         "diffmem.diffusion", "diffmem.metrics", "diffmem.experiment", "diffmem.samplegrid",
                         "diffmem.rundir", "diffmem.jobrecords", "diffmem.copyrecord")),
    ("reading runs", ("diffmem.analysis.runfiles", "diffmem.analysis.timescales", "diffmem.analysis.cellfit",
                      "diffmem.analysis.goodness", "diffmem.analysis.powerlaw",
                      "diffmem.split_pairs", "diffmem.refine", "diffmem.monitor", "diffmem.tensorboard")),
    ("training and evaluation", ("diffmem.evaluate", "diffmem.train", "diffmem.paired_evaluation",
                                 "diffmem.throughput")),
    ("analysis", ("diffmem.analysis",)),
    ("figures", ("diffmem.figures",)),
    ("theory and results", ("diffmem.theory", "diffmem.results")),
    ("cluster engine", ("diffmem.cluster",)),
    ("sweep and status", ("diffmem.sweep", "diffmem.status")),
    ("demo", ("diffmem.demo",)),
    ("command line", ("diffmem.cli",)),
]


def package_modules(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file of the package (a package is its __init__.py)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def owning_module(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ``modules`` that an imported dotted name lands in (``a.b.c`` -> ``a.b`` when c is a name)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_from(module: str, node: ast.ImportFrom, modules: dict[str, Path]) -> str:
    """The absolute module an ``from ... import`` names, relative imports resolved against ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if modules[module].name != "__init__.py":
        base = base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(modules: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the package's modules it imports, "file:line: name from module" per private name imported
    across modules)."""
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                source = imported_from(module, node, modules)
                targets = []
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    targets.append(full if full in modules else source)
                    if alias.name.startswith("_") and not alias.name.startswith("__") and source in modules \
                            and source != module:
                        private.append(f"{path.name}:{node.lineno}: {alias.name} from {source}")
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                owner = owning_module(target, modules)
                if owner is not None and owner != module:
                    edges[module].add(owner)
    return edges, private


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def room(module: str) -> str:
    """The top-level module or package of the package that a module belongs to (``diffmem.analysis.powerlaw`` ->
    ``diffmem.analysis``)."""
    return ".".join(module.split(".")[:2])


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the longest entry covering ``module``, or None when no entry does."""
    best, best_length = None, -1
    for i, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            covers = module == entry or (module.startswith(entry + ".") and entry != PACKAGE)
            if covers and len(entry) > best_length:
                best, best_length = i, len(entry)
    return best


MODULES = package_modules(PACKAGE_DIR)
EDGES, PRIVATE = import_graph(MODULES)


# --- the checker against small hand-made graphs ------------------------------------------------------------------

def test_circles_finds_each_circle_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set(), "f": {"f2"}, "f2": {"f"}}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["f", "f2"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_import_graph_reads_absolute_relative_lazy_and_private_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("X = 1\n_Y = 2\n")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("from ..low import X\n")
    (pkg / "top.py").write_text("import json\n\ndef f():\n    from pkg.low import _Y\n    import pkg.sub.leaf\n")
    modules = package_modules(pkg)
    edges, private = import_graph(modules)
    assert edges["pkg.sub"] == {"pkg.sub.leaf"}
    assert edges["pkg.sub.leaf"] == {"pkg.low"}
    assert edges["pkg.top"] == {"pkg.low", "pkg.sub.leaf"}
    assert private == ["top.py:4: _Y from pkg.low"]


# --- the package ---------------------------------------------------------------------------------------------------

def test_no_import_circles_between_modules():
    assert circles(EDGES) == []


def test_no_import_circles_between_top_level_modules_and_packages():
    rooms: dict[str, set[str]] = {}
    for module, targets in EDGES.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets if room(t) != room(module))
    for targets in list(rooms.values()):
        for t in targets:
            rooms.setdefault(t, set())
    assert circles(rooms) == []


def test_no_private_name_imported_across_modules():
    assert PRIVATE == []


def test_every_module_has_a_layer():
    unplaced = [m for m in MODULES if layer_of(m) is None]
    assert unplaced == [], "place each new module in LAYERS (and in docs/architecture.md's module map)"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module):
    mine = layer_of(module)
    above = sorted(f"{t} ({LAYERS[layer_of(t)][0]})" for t in EDGES[module] if layer_of(t) > mine)
    assert above == [], f"{module} ({LAYERS[mine][0]}) imports from a layer above it"


# --- the module map of docs/architecture.md ------------------------------------------------------------------------

def module_map(text: str) -> dict[str, list[tuple[str, str]]]:
    """The "Modules" block of docs/architecture.md: layer name -> [(entry, its description)], where an entry is the
    first word of a line (a path under diffmem/, e.g. ``cluster/base.py`` or ``rundir/``) and continuation lines
    (indented) add to its description; a line ``--- name (...)`` starts a layer."""
    block = text.split("## Modules", 1)[1].split("```", 2)[1]
    layers: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in block.splitlines():
        if line.startswith("--- "):
            current = layers.setdefault(line[4:].split(" (")[0].strip(), [])
        elif line.strip() and current is not None:
            if line.startswith(" "):
                entry, description = current[-1]
                current[-1] = (entry, description + " " + line.strip())
            else:
                entry, _, description = line.partition(" ")
                current.append((entry, description.strip()))
    return layers


def test_the_module_map_lists_every_module_in_its_layer_in_the_order_of_the_layers():
    layers = module_map((PACKAGE_DIR.parent / "docs" / "architecture.md").read_text())
    assert list(layers) == [name for name, _ in reversed(LAYERS)]
    misplaced = []
    for module, path in MODULES.items():
        relative = path.relative_to(PACKAGE_DIR).as_posix()
        package, _, base = relative.rpartition("/")

        def names_it(entry: str, description: str) -> bool:
            if entry == relative:
                return True
            return bool(package) and entry == f"{package}/" and \
                (base == "__init__.py" or base in re.findall(r"[\w.]+\.py", description))

        where = [layer for layer, entries in layers.items() for entry, description in entries
                 if names_it(entry, description)]
        layer = LAYERS[layer_of(module)][0]
        if where != [layer]:
            misplaced.append(f"{relative}: in {where or 'no layer'} of the map, in {layer!r} of LAYERS")
    assert misplaced == []
