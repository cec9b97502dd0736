"""Architecture checks on the source text (ast): no import cycles, and dask/distributed only where allowed.

The modules are read, not imported, so the checks see every import, including the
lazy ones inside functions, and cannot be fooled by what happens to be loaded.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "daskkrr"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts)  # a package is its "pkg.__init__" module


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """Every import in ``path`` (module level and inside functions) as ``(module, name)``.

    ``import a.b`` gives ``("a.b", None)``; ``from a import b`` gives ``("a", "b")``,
    with relative imports made absolute.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path).rsplit(".", 1)[0]  # for "x.__init__" this is the package "x" itself
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            found.extend((source, alias.name) for alias in node.names)
    return found


def _imported_names(path: Path) -> set[str]:
    """The dotted names ``path`` imports from (``from a.b import c`` counts as ``a.b``)."""
    return {module for module, _ in _imports(path)}


def _module_file(name: str, modules: set[str]) -> str | None:
    """The daskkrr module file of a dotted name (a package means its __init__), or None."""
    if name in modules:
        return name
    if f"{name}.__init__" in modules:
        return f"{name}.__init__"
    return None


def _resolve(module: str, name: str | None, modules: set[str]) -> str | None:
    """``from module import name`` -> ``module.name`` when that is a module, else ``module``."""
    if name is not None:
        submodule = _module_file(f"{module}.{name}", modules)
        if submodule is not None:
            return submodule
    return _module_file(module, modules)


#: Known cycle edges, to be removed (and then deleted here) rather than added to.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()  # none: keep it that way


def _import_graph() -> dict[str, set[str]]:
    sources = _sources()
    modules = set(sources)
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        edges = set()
        for imported, name in _imports(path):
            target = _resolve(imported, name, modules)
            if target is None or target == module:
                continue
            for node in (*_parent_packages(target, modules), target):
                package = node.removesuffix(".__init__")
                if node.endswith(".__init__") and module.startswith(package + "."):
                    continue  # a package's own modules importing its __init__: re-exports, not a cycle
                edges.add(node)
        graph[module] = edges
    return graph


def _parent_packages(target: str, modules: set[str]) -> list[str]:
    """The ``__init__`` modules Python runs before ``target``: importing ``daskkrr.a.b`` runs
    ``daskkrr/a/__init__.py`` first (the top-level package's lazy ``__init__`` is left out)."""
    parts = target.removesuffix(".__init__").split(".")
    inits = [".".join(parts[:i]) + ".__init__" for i in range(2, len(parts))]
    return [m for m in inits if m in modules]


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a closed path ``[a, b, ..., a]``, or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for root in sorted(graph):
        if root in state:
            continue
        path = [root]
        stack = [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph.get(child, ()))))
    return None


def test_cycle_finder_sees_a_cycle_and_ignores_a_dag():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_graph_resolves_submodules_packages_and_function_level_imports():
    modules = set(_sources())
    assert _resolve("daskkrr.data", "loading", modules) == "daskkrr.data.loading"
    assert _resolve("daskkrr.data", "Standardizer", modules) == "daskkrr.data.__init__"
    assert _resolve("numpy", "asarray", modules) is None
    # `from daskkrr.dashboard import install` sits inside run_fit: function-level imports count.
    assert "daskkrr.dashboard.__init__" in _import_graph()["daskkrr.pipeline.run"]


def test_importing_a_submodule_runs_its_package_init():
    # pipeline.stages -> data.inputs also runs data/__init__.py: a cycle through it is a real one.
    assert "daskkrr.data.__init__" in _import_graph()["daskkrr.pipeline.stages"]


def test_no_import_cycles():
    graph = _import_graph()
    for source, target in KNOWN_CYCLE_EDGES:
        graph[source] = graph[source] - {target}
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_known_cycle_edges_still_exist():
    graph = _import_graph()
    gone = {(s, t) for s, t in KNOWN_CYCLE_EDGES if t not in graph.get(s, ())}
    assert not gone, f"these imports are gone: delete them from KNOWN_CYCLE_EDGES: {sorted(gone)}"


# --------------------------------------------------------------------------- layering
#: Where ``distributed`` may be imported: the execution layer (clients, backends) and the
#: scheduler-side dashboard. Everything else - sampling, progress, the models, the CLI and
#: workflows included - reaches the cluster through daskkrr.parallel and runs without it.
DISTRIBUTED_ALLOWED = (
    "parallel/",
    "dashboard/",
)

#: The numerical layers: plain numpy/numba on in-memory blocks, no dask at all.
DASK_FREE = ("kernels/", "solvers/", "utils/", "bandits/")


def _imports_of(path: Path, top: str) -> list[str]:
    return sorted({n for n in _imported_names(path) if n == top or n.startswith(top + ".")})


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE_DIR).as_posix()


def _allowed(rel: str, prefixes: tuple[str, ...]) -> bool:
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes)


def test_distributed_is_imported_only_by_the_execution_layer():
    offenders = {
        rel: names
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if not _allowed(rel := _relative(path), DISTRIBUTED_ALLOWED)
        and (names := _imports_of(path, "distributed"))
    }
    assert not offenders, f"distributed imported outside {DISTRIBUTED_ALLOWED}: {offenders}"


def test_numerical_layers_do_not_import_dask():
    offenders = {
        rel: names
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if _allowed(rel := _relative(path), DASK_FREE) and (names := _imports_of(path, "dask"))
    }
    assert not offenders, f"dask imported under {DASK_FREE}: {offenders}"


def test_layer_checks_see_the_imports_they_police():
    # Guards against a vacuous pass: the allowed layers do import distributed / dask.
    assert any(_imports_of(p, "distributed") for p in (PACKAGE_DIR / "parallel").rglob("*.py"))
    assert _imports_of(PACKAGE_DIR / "data" / "loading.py", "dask")
