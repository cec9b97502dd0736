"""Architecture checks on the source text (ast): the layer order, no import cycles, and dask only where allowed.

The modules are read, not imported, so the checks see every import: module level, inside
functions (lazy imports) and under ``if TYPE_CHECKING:``, and cannot be fooled by what
happens to be loaded. The order and the rules are those of ``docs/guide/design.rst``.

Policy for ``TYPE_CHECKING`` imports: they count for the layer order like any other import
(a type-only import upward still makes the lower layer name the upper one's classes, and
becomes a real import the day someone needs an ``isinstance``); for Dask they count as
types only, which the layers that may hold dask arrays but build no graphs are allowed.

The checkers are functions of the import graph given as data (``_edges(sources)`` from the
source texts), so the tests below feed them the real package and the real package with one
import planted, and see the planted one reported.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "daskkrr"

# --------------------------------------------------------------------------- the order
#: The layers, bottom first: (name, units, dask). A unit is a subpackage or a top-level module of
#: daskkrr. A unit imports only units of *lower* layers (units of one layer are independent of one
#: another). ``dask`` says what a layer may do with Dask: "graphs" (import dask and build graphs),
#: "types" (hold dask arrays: ``import dask`` under ``TYPE_CHECKING`` only) or "none" (no dask at all).
LAYERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("foundation", ("utils", "events", "signals"), "none"),
    ("kernels", ("kernels",), "none"),
    ("algorithms", ("solvers", "bandits"), "none"),
    ("execution", ("parallel",), "graphs"),
    ("data", ("data",), "graphs"),
    ("centers", ("sampling",), "types"),
    ("subscribers", ("progress", "checkpoint"), "types"),
    ("dashboard", ("dashboard",), "types"),
    ("pipeline", ("pipeline",), "types"),
    ("estimators", ("models",), "types"),
    ("configuration", ("config",), "types"),
    ("applications", ("tune", "workflow", "quickstart", "plot", "testing", "export"), "types"),
    ("command line", ("cli",), "types"),
)

#: Where ``distributed`` may be imported: the execution layer (clients, backends) and the
#: scheduler-side dashboard. Everything else reaches the cluster through daskkrr.parallel.
DISTRIBUTED_ALLOWED = ("parallel", "dashboard")

#: Modules of a "types" layer that import dask at run time today, each with why. Known debt:
#: delete an entry when its module stops needing dask (``test_dask_exceptions_are_still_needed``).
DASK_EXCEPTIONS: dict[str, str] = {
    "daskkrr.cli": "dask.config.refresh() after setting DASK_ environment variables; builds no graph",
    "daskkrr.dashboard.plugin": "dask.utils.key_split names the scheduler's tasks; builds no graph",
    "daskkrr.progress.tracker": "dask.annotate tags the fit's tasks with its id for the dashboard",
    "daskkrr.sampling.base": "as_row_chunked wraps an in-memory array as one dask array for the executor",
    "daskkrr.sampling.exact": "isinstance(X, dask.array.Array) before gathering the rows on the client",
    "daskkrr.pipeline.stages": "builds the target graph (weights scaled by powers of two, a ones column)",
    "daskkrr.pipeline.unsupervised": "lazy_labels: predict-time k-means labels as a map_blocks graph",
    "daskkrr.pipeline.logistic": "the +-1 codes and weights as one target array for the Newton passes",
    "daskkrr.pipeline.exact_pcg": "sqrt of the row weights rechunked to the kernel tiles",
    "daskkrr.models.classifier": "class labels: unique, and one-vs-all codes by map_blocks",
    "daskkrr.models.weights": "class weights per row by map_blocks; bincount of the class codes",
}


def _layer_of() -> dict[str, int]:
    return {unit: rank for rank, (_, units, _) in enumerate(LAYERS) for unit in units}


def _dask_policy() -> dict[str, str]:
    return {unit: dask for _, units, dask in LAYERS for unit in units}


# --------------------------------------------------------------------------- reading the imports
def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts)  # a package is its "pkg.__init__" module


def _sources() -> dict[str, str]:
    """Every daskkrr module's source text by module name."""
    return {_module_name(p): p.read_text(encoding="utf-8") for p in sorted(PACKAGE_DIR.rglob("*.py"))}


@dataclasses.dataclass(frozen=True)
class Import:
    """One ``import`` statement's name: ``module`` (absolute), ``name`` (``from module import name``)."""

    module: str
    name: str | None
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _ImportVisitor(ast.NodeVisitor):
    """Every import in a module, module level, in functions and under ``TYPE_CHECKING``."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.type_only = False
        self.found: list[Import] = []

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        outer, self.type_only = self.type_only, True
        for child in node.body:
            self.visit(child)
        self.type_only = outer
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.extend(Import(alias.name, None, node.lineno, self.type_only) for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.rsplit(".", node.level - 1)[0] if node.level > 1 else self.package
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        self.found.extend(Import(source, alias.name, node.lineno, self.type_only) for alias in node.names)


@functools.cache
def _imports(module: str, text: str) -> tuple[Import, ...]:
    """Every import of module ``module`` (source ``text``), relative imports made absolute.

    Cached on the text: a planted copy of the package parses only the module it changed."""
    tree = ast.parse(text, filename=module)
    visitor = _ImportVisitor(module.rsplit(".", 1)[0])  # for "x.__init__" this is the package "x" itself
    visitor.visit(tree)
    return tuple(visitor.found)


def _module_file(name: str, modules: set[str]) -> str | None:
    """The daskkrr module file of a dotted name (a package means its __init__), or None."""
    if name in modules:
        return name
    if f"{name}.__init__" in modules:
        return f"{name}.__init__"
    return None


def _lazy_names(sources: dict[str, str]) -> dict[str, str]:
    """``daskkrr.__init__``'s lazy names -> the module ``from daskkrr import name`` really imports."""
    tree = ast.parse(sources.get("daskkrr.__init__", ""))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and node.value is not None:
                lazy = ast.literal_eval(node.value)
                return {name: target if isinstance(target, str) else target[0] for name, target in lazy.items()}
    return {}


def _resolve(module: str, name: str | None, modules: set[str], lazy: dict[str, str] | None = None) -> str | None:
    """``from module import name`` -> ``module.name`` when that is a module, else ``module``;
    ``from daskkrr import FalkonRegressor`` -> the module the top-level package loads it from."""
    if name is not None:
        submodule = _module_file(f"{module}.{name}", modules)
        if submodule is not None:
            return submodule
        if module == "daskkrr" and lazy and name in lazy:
            return _module_file(lazy[name], modules)
    return _module_file(module, modules)


@dataclasses.dataclass(frozen=True)
class Edge:
    """Module ``source`` imports module ``target`` (daskkrr modules, ``pkg.__init__`` for a package)."""

    source: str
    target: str
    line: int
    type_only: bool


def _edges(sources: dict[str, str]) -> list[Edge]:
    """The import graph of ``sources`` (module name -> text), one edge per import of a daskkrr module."""
    modules = set(sources)
    lazy = _lazy_names(sources)
    edges = []
    for module, text in sources.items():
        for imp in _imports(module, text):
            target = _resolve(imp.module, imp.name, modules, lazy)
            if target is not None and target != module:
                edges.append(Edge(module, target, imp.line, imp.type_only))
    return list(dict.fromkeys(edges))  # ``from a import b, c``: one edge


def _unit(module: str) -> str:
    """The layer unit of a module: its subpackage or top-level module ("" for ``daskkrr`` itself)."""
    parts = module.removesuffix(".__init__").split(".")
    return parts[1] if len(parts) > 1 else ""


# --------------------------------------------------------------------------- the checkers
def layer_violations(edges: list[Edge]) -> list[str]:
    """Every import against the order of :data:`LAYERS`, as a message naming the file, line and rule."""
    layer = _layer_of()
    found = []
    for e in edges:
        src, dst = _unit(e.source), _unit(e.target)
        if src == dst or dst == "":  # inside a unit; or ``daskkrr`` itself (``__version__``): imports nothing
            continue
        unplaced = [u for u in (src, dst) if u not in layer]
        if unplaced:
            found.append(f"{e.source}:{e.line} imports {e.target}: "
                         f"{unplaced[0] or 'daskkrr/__init__.py (it loads lazily, importing nothing)'!r} "
                         "has no layer in LAYERS")
        elif layer[dst] >= layer[src]:
            where = "the same layer as" if layer[dst] == layer[src] else "a higher layer than"
            found.append(f"{e.source}:{e.line} imports {e.target}{' (TYPE_CHECKING)' if e.type_only else ''}: "
                         f"{dst!r} ({LAYERS[layer[dst]][0]}) is in {where} {src!r} ({LAYERS[layer[src]][0]}); "
                         "move the code down, or have the upper layer pass it down")
    return found


def private_name_violations(sources: dict[str, str]) -> list[str]:
    """``from daskkrr.a import _name`` across units: a private name is its own unit's business."""
    modules = set(sources)
    found = []
    for module, text in sources.items():
        for imp in _imports(module, text):
            if (imp.name and imp.name.startswith("_") and imp.module.startswith("daskkrr.")
                    and _module_file(f"{imp.module}.{imp.name}", modules) is None
                    and _unit(imp.module) != _unit(module)):
                found.append(f"{module}:{imp.line} imports the private {imp.module}.{imp.name}")
    return found


def _with_parent_inits(edges: list[Edge], modules: set[str]) -> dict[str, set[str]]:
    """The module graph with the ``__init__`` modules Python runs before a target: importing
    ``daskkrr.a.b`` runs ``daskkrr/a/__init__.py`` first (the top-level package's lazy ``__init__``
    and a package's own modules importing its ``__init__``, re-exports, are left out)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        parts = e.target.removesuffix(".__init__").split(".")
        inits = [m for m in (".".join(parts[:i]) + ".__init__" for i in range(2, len(parts))) if m in modules]
        for node in (*inits, e.target):
            package = node.removesuffix(".__init__")
            if not (node.endswith(".__init__") and e.source.startswith(package + ".")):
                graph[e.source].add(node)
    return graph


def _package_graph(edges: list[Edge]) -> dict[str, set[str]]:
    """The graph of units: ``a -> b`` where a module of ``a`` imports one of ``b``."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        src, dst = _unit(e.source), _unit(e.target)
        graph.setdefault(src, set())
        graph.setdefault(dst, set())
        if src != dst and dst:
            graph[src].add(dst)
    return graph


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


def _dask_imports(module: str, text: str, top: str = "dask") -> list[Import]:
    return [imp for imp in _imports(module, text) if imp.module == top or imp.module.startswith(top + ".")]


def dask_violations(sources: dict[str, str], exceptions: dict[str, str] = DASK_EXCEPTIONS) -> list[str]:
    """Every dask import against a layer's ``dask`` rule (less the listed exceptions), and every
    ``distributed`` import outside :data:`DISTRIBUTED_ALLOWED`."""
    policy = _dask_policy()
    found = []
    for module, text in sources.items():
        rule = policy.get(_unit(module), "none")
        for imp in _dask_imports(module, text):
            allowed = rule == "graphs" or (rule == "types" and (imp.type_only or module in exceptions))
            if not allowed:
                may = "hold dask types only (import dask under TYPE_CHECKING)" if rule == "types" else "not use dask"
                found.append(f"{module}:{imp.line} imports {imp.module}{' (TYPE_CHECKING)' if imp.type_only else ''}"
                             f": the layer of {_unit(module)!r} may {may}; move the graph into data/ or parallel/")
        if _unit(module) not in DISTRIBUTED_ALLOWED:
            found.extend(f"{module}:{imp.line} imports {imp.module}: only {DISTRIBUTED_ALLOWED} may import distributed"
                         for imp in _dask_imports(module, text, "distributed"))
    return found


# --------------------------------------------------------------------------- the package as it is
@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return _sources()


@pytest.fixture(scope="module")
def edges(sources: dict[str, str]) -> list[Edge]:
    return _edges(sources)


def test_every_unit_has_a_layer(sources):
    # A new subpackage or top-level module must be placed in the order, not slip past the check.
    layer = _layer_of()
    units = {_unit(m) for m in sources} - {""}
    assert not units - set(layer), f"place these in LAYERS (and in docs/guide/design.rst): {sorted(units - set(layer))}"
    assert not set(layer) - units, f"LAYERS names units that do not exist: {sorted(set(layer) - units)}"
    assert len(layer) == sum(len(units) for _, units, _ in LAYERS), "a unit is in two layers"


def test_imports_follow_the_layer_order(edges):
    violations = layer_violations(edges)
    assert not violations, "imports against the layer order:\n" + "\n".join(violations)


def test_no_private_names_across_units(sources):
    violations = private_name_violations(sources)
    assert not violations, "make these public in their own unit:\n" + "\n".join(violations)


def test_no_module_import_cycles(sources, edges):
    cycle = _find_cycle(_with_parent_inits(edges, set(sources)))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_package_import_cycles(edges):
    cycle = _find_cycle(_package_graph(edges))
    assert cycle is None, "package cycle: " + " -> ".join(cycle or [])


def test_dask_only_where_the_layer_allows(sources):
    violations = dask_violations(sources)
    assert not violations, "dask against the layer rules:\n" + "\n".join(violations)


def test_dask_exceptions_are_still_needed(sources):
    stale = {m for m in DASK_EXCEPTIONS
             if m not in sources or all(imp.type_only for imp in _dask_imports(m, sources[m]))}
    assert not stale, f"these no longer import dask at run time: delete them from DASK_EXCEPTIONS: {sorted(stale)}"


# --------------------------------------------------------------------------- the reader sees what it polices
def test_graph_resolves_submodules_packages_lazy_names_and_function_level_imports(sources, edges):
    modules = set(sources)
    lazy = _lazy_names(sources)
    assert _resolve("daskkrr.data", "loading", modules) == "daskkrr.data.loading"
    assert _resolve("daskkrr.data", "Standardizer", modules) == "daskkrr.data.__init__"
    assert _resolve("numpy", "asarray", modules) is None
    assert _resolve("daskkrr", "FalkonRegressor", modules, lazy) == "daskkrr.models.__init__"
    assert _resolve("daskkrr", "__version__", modules, lazy) == "daskkrr.__init__"
    # `from daskkrr.dashboard import install` sits inside run_fit: function-level imports count.
    assert any(e.source == "daskkrr.pipeline.run" and e.target == "daskkrr.dashboard.__init__" for e in edges)
    # sampling.squeak imports dask.array under TYPE_CHECKING only
    assert {imp.type_only for imp in _dask_imports("daskkrr.sampling.squeak", sources["daskkrr.sampling.squeak"])} \
        == {True}


def test_importing_a_submodule_runs_its_package_init(sources, edges):
    # pipeline.stages -> data.inputs also runs data/__init__.py: a cycle through it is a real one.
    assert "daskkrr.data.__init__" in _with_parent_inits(edges, set(sources))["daskkrr.pipeline.stages"]


def test_cycle_finder_sees_a_cycle_and_ignores_a_dag():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_a_planted_cycle_in_the_real_graph_is_found(sources, edges):
    # utils.threads -> cli closes a cycle (cli imports utils); both graphs must report it.
    planted = [*edges, Edge("daskkrr.utils.threads", "daskkrr.cli", 1, False)]
    module_cycle = _find_cycle(_with_parent_inits(planted, set(sources)))
    assert module_cycle is not None and "daskkrr.cli" in module_cycle
    package_cycle = _find_cycle(_package_graph(planted))
    assert package_cycle is not None and {"utils", "cli"} <= set(package_cycle)


# --------------------------------------------------------------------------- planted imports are reported
#: The forms a planted import takes, one per layer in turn: each must be seen.
PLANTS = (
    "\nfrom {target} import {name}  # planted\n",
    "\n\ndef _planted_lazy():\n    import {target}  # planted\n    return {target}\n",
    "\nimport typing\n\nif typing.TYPE_CHECKING:\n    from {target} import {name}  # planted\n",
)


def _first_module(sources: dict[str, str], unit: str) -> str:
    return min(m for m in sources if _unit(m) == unit)


@pytest.mark.parametrize("rank", range(len(LAYERS) - 1), ids=[name for name, _, _ in LAYERS[:-1]])
def test_a_planted_upward_import_is_reported(sources, rank):
    """One import from each layer into the layer above it (and one into its own layer's
    sibling, where it has one) in each form: the checker names the file and the target."""
    unit = LAYERS[rank][1][0]
    above = LAYERS[rank + 1][1][0]
    module = _first_module(sources, unit)
    target = _first_module(sources, above).removesuffix(".__init__")
    plant = PLANTS[rank % len(PLANTS)].format(target=target, name="planted_name")
    before = set(layer_violations(_edges(sources)))
    found = set(layer_violations(_edges({**sources, module: sources[module] + plant}))) - before
    assert len(found) == 1, found
    # the source ends with a newline, so the plant's line i (from 0) is the file's line len + i + 1
    line = len(sources[module].splitlines()) + 1 + next(i for i, t in enumerate(plant.split("\n")) if "# planted" in t)
    assert next(iter(found)).startswith(f"{module}:{line} imports {target}"), found
    if len(LAYERS[rank][1]) > 1:  # siblings of one layer are independent too
        sibling = _first_module(sources, LAYERS[rank][1][1]).removesuffix(".__init__")
        planted = {**sources, module: sources[module] + PLANTS[0].format(target=sibling, name="x")}
        assert any("the same layer" in v for v in set(layer_violations(_edges(planted))) - before)


def test_a_planted_unplaced_unit_is_reported(sources):
    planted = {**sources, "daskkrr.newpkg.__init__": "from daskkrr.utils import jsonable\n"}
    assert any("'newpkg' has no layer" in v for v in layer_violations(_edges(planted)))


def test_a_planted_private_import_across_units_is_reported(sources):
    planted = {**sources, "daskkrr.sampling.base": sources["daskkrr.sampling.base"]
               + "\nfrom daskkrr.parallel.resources import _available_memory\n"}
    assert [v for v in private_name_violations(planted) if "_available_memory" in v]


@pytest.mark.parametrize("rank", range(len(LAYERS)), ids=[name for name, _, _ in LAYERS])
def test_a_planted_dask_import_is_judged_by_the_layer_rule(sources, rank):
    """``import dask.array`` at run time is reported outside the "graphs" layers; under
    TYPE_CHECKING it is reported only in the "none" layers; ``distributed`` outside its two."""
    _, units, rule = LAYERS[rank]
    module = _first_module(sources, units[0])

    def reported(plant: str) -> bool:
        # judged without the exception list, which would excuse a listed module's planted import
        found = dask_violations({**sources, module: sources[module] + plant}, exceptions={})
        return any(v.startswith(f"{module}:") for v in set(found) - set(dask_violations(sources, exceptions={})))

    assert reported("\nimport dask.array  # planted\n") == (rule != "graphs")
    assert reported(PLANTS[2].format(target="dask.array", name="Array")) == (rule == "none")
    assert reported("\nimport distributed  # planted\n") == (units[0] not in DISTRIBUTED_ALLOWED)
