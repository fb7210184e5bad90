"""No two of agentkit's modules import each other in a circle, counted as installed.

Every module is parsed with ``ast`` (nothing is imported); its name is the one it has once
installed (``envs/gym.py`` is ``agentkit.envs.gym``: pyproject's ``package-dir``). An import at
module level and one inside a function both count as an edge: a function-level import only
postpones the circle to the first call. Imports under ``if TYPE_CHECKING:`` never run and do not
count. ``from package import name`` is an edge to ``package.name`` when that is a module, else
to the package.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def installed_modules() -> dict[str, Path]:
    """Module name as installed -> its file, for every package pyproject lists."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = setuptools.get("package-dir", {})
    modules = {}
    for package in setuptools["packages"]:
        # the longest mapped prefix gives the folder, as setuptools reads package-dir: agentkit.envs.webshop -> envs/webshop
        parent = max((p for p in folders if package == p or package.startswith(p + ".")), key=len, default=None)
        folder = ROOT / (package.replace(".", "/") if parent is None
                         else folders[parent] + package[len(parent):].replace(".", "/"))
        assert folder.is_dir(), f"pyproject lists {package}, but {folder} is no folder"
        for path in folder.glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every import statement that runs (module level or in a function), skipping ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking_only(node):
            yield from (n for child in node.orelse for n in _imports_in(child))
            continue
        yield from _imports_in(node)


def _imports_in(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _imports(node)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: dict[str, Path]) -> set[str]:
    """The modules of ours that ``node`` (in ``module``) imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:  # relative: from the package holding this module
        parts = module.split(".")
        anchor = parts if is_package else parts[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    found = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            found.add(f"{base}.{alias.name}")
        elif base in known:
            found.add(base)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports."""
    known = installed_modules()
    graph = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[module] = set().union(*(_targets(n, module, is_package, known) for n in _imports(tree))) - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module, as a path that starts
    and ends at the same module (the shortest through the component's first module)."""
    return [_path_in(graph, component) for component in components(graph)]


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): modules that reach each
    other through their imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _path_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest circle through the component's first module (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start}")  # a strongly connected component always has one


def test_the_graph_covers_the_installed_folders():
    graph = import_graph()
    assert {"agentkit.train", "agentkit.envs.registry", "agentkit.rollout.workers", "agentkit.core.runs"} <= set(graph)
    assert "agentkit.envs.protocol" in graph["agentkit.envs.registry"]  # an edge as installed


def test_cycles_are_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph = import_graph()
    found = [" -> ".join(_path_in(graph, component)) + (f"  (the circle holds {', '.join(sorted(component))})"
                                                         if len(component) > 2 else "")
             for component in components(graph)]
    assert not found, ("modules import each other in a circle (move what both need to a module below them, or the "
                       "one that reads both above them):\n" + "\n".join(found))


def test_only_the_train_package_imports_the_loop():
    """The loop is reached as ``agentkit.train``; the async generator, the CLI and the rest never
    import the loop module itself (nor it them back)."""
    graph = import_graph()
    importers = sorted(module for module, targets in graph.items() if "agentkit.train.loop" in targets)
    assert importers == ["agentkit.train"], importers
    assert "agentkit.train" not in graph["agentkit.train.loop"] | graph["agentkit.train.run_folder"]


def test_every_package_folder_is_installed():
    """A folder of ours with an ``__init__.py`` that pyproject does not list would be missing from an install."""
    listed = {path.parent for path in installed_modules().values()}
    for init in [*ROOT.glob("agentkit/**/__init__.py"), *ROOT.glob("envs/**/__init__.py")]:
        assert init.parent in listed, f"{init.parent} is a package that pyproject.toml's packages do not list"


# the floors of the house, bottom up: a module imports only from its own floor or below
FLOORS = (
    ("agentkit.core",),
    ("agentkit.envs", "agentkit.objectives", "agentkit.skillbank"),
    ("agentkit.rollout", "agentkit.models"),
    ("agentkit.teachers",),
    ("agentkit.report",),
    ("agentkit.train",),
    ("agentkit.cli", "agentkit.settings_doc", "agentkit"),
)


def floor_of(module: str) -> int:
    """The floor of ``module``: the floor of the longest listed prefix."""
    best = max((prefix for floor in FLOORS for prefix in floor if module == prefix or module.startswith(prefix + ".")),
               key=len)
    return next(i for i, floor in enumerate(FLOORS) if best in floor)


def test_no_import_goes_up_a_floor():
    graph = import_graph()
    up = sorted(f"{module} (floor {floor_of(module)}) -> {target} (floor {floor_of(target)})"
                for module, targets in graph.items() for target in targets if floor_of(target) > floor_of(module))
    assert not up, ("a lower floor imports a higher one (move what it needs down, or the importer up):\n"
                    + "\n".join(up))
    assert floor_of("agentkit.envs.webshop.env") == 1 and floor_of("agentkit.train.loop") == 5
