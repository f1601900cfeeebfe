"""The package's layering: no import cycles at module level, and the low layers know nothing of the high ones."""

import __future__

import argparse
import ast
import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import flowkit

ROOT = Path(flowkit.__file__).parent

#: The layers, lowest first: a module may import its own layer and the ones below, never one above.
#: Units are top-level modules and subpackages of flowkit (`flowkit.targets` stands for all of its modules),
#: and the few modules listed apart from their subpackage (a module belongs to the longest unit that holds it).
LAYERS = (
    # shared infrastructure
    (
        "flowkit._config",
        "flowkit._validation",
        "flowkit.utils",
        "flowkit.domains",
        "flowkit.root_finding",
        "flowkit._deprecation",
    ),
    ("flowkit.stats",),
    # the maths: the spline's reference, its fast kernels, the transformers that run on them
    ("flowkit.transformers.rational_quadratic",),
    ("flowkit.kernels",),
    ("flowkit.transformers", "flowkit.nn", "flowkit.distributions"),
    ("flowkit.bijectors", "flowkit.lattice", "flowkit._legacy", "flowkit.embeddings"),
    ("flowkit.targets",),
    # Markov transition kernels: below the flows, whose stochastic blocks make the samplers' moves
    ("flowkit.transitions",),
    ("flowkit.flows", "flowkit.compiled"),
    # what works on any flow and target
    ("flowkit.sampling", "flowkit.testing", "flowkit.data", "flowkit.io"),
    ("flowkit.train", "flowkit.interop", "flowkit.plot"),
    # temporal point processes: models trained with the fit loop, their plots
    ("flowkit.events",),
    # simulation-based inference: posterior estimators on the flows (in sbi and lampe too), trained with the fit loop;
    # morphing simulated events into data
    ("flowkit.inference",),
    # a paper's use of flows, built from all of the above
    ("flowkit.applications",),
    # deprecated aliases: `flowkit.stochastic` serves flowkit.flows.stochastic
    ("flowkit.cli", "flowkit.__main__", "flowkit.stochastic"),
)

#: Imports that point upwards or close a cycle, by importing module and imported unit, each with its reason.
EXCEPTIONS = {
    # `io.load` imports every subpackage (through `flowkit.io.register_every_class`) so that every saveable class is
    # registered before a config names it; nothing is used by name.
    ("flowkit.io", "flowkit"): "registry",
}

#: Modules that import lazily (inside functions) for a fast `flowkit --help`; their lazy imports may form cycles
#: with the package's root (`from .. import x`).
LAZY_IMPORTERS = ("flowkit.cli", "flowkit.__main__")

PEERS = ("zuko", "nflows", "normflows")


def _modules() -> dict[str, Path]:
    found = {"flowkit": ROOT / "__init__.py"}
    for info in pkgutil.walk_packages([str(ROOT)], prefix="flowkit."):
        spec = importlib.util.find_spec(info.name)
        found[info.name] = Path(spec.origin)
    return found


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _imports(module: str, top_level_only: bool) -> set[str]:
    """Modules imported by ``module`` (at module level only, or anywhere), submodules of ``from`` imports included."""
    tree = ast.parse(MODULES[module].read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # imports under `if TYPE_CHECKING:` do not run
        nodes = [n for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))]
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            submodules = {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES}
            if base != "flowkit" or len(submodules) < len(node.names):  # `from flowkit import io` runs io alone
                out.add(base)
            out.update(submodules)
    return out


def _inside(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


UNITS = {unit for layer in LAYERS for unit in layer}


def _unit(name: str) -> str:
    """The layer unit of a module: `flowkit.targets.alanine` -> `flowkit.targets`, or a module listed apart."""
    parts = name.split(".")
    return next((u for n in range(len(parts), 2, -1) if (u := ".".join(parts[:n])) in UNITS), ".".join(parts[:2]))


def _layer(unit: str) -> int:
    for level, units in enumerate(LAYERS):
        if unit in units:
            return level
    raise AssertionError(f"{unit} is in no layer of tests/test_architecture.py: add it to LAYERS")


def _edges(module: str, top_level_only: bool) -> set[str]:
    """The flowkit modules `module` imports, less its own ancestors and the named exceptions."""
    out = set()
    for d in _imports(module, top_level_only):
        if d not in MODULES or d == module or module.startswith(d + "."):
            continue
        if (module, _unit(d)) in EXCEPTIONS or (module, d) in EXCEPTIONS:
            continue
        out.add(d)
    return out


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module level", "every level"])
def test_no_import_cycles(top_level_only):
    # A submodule's import of its own ancestor packages is how Python imports it; those edges are not cycles.
    graph = {m: _edges(m, top_level_only) for m in MODULES if top_level_only or not _inside(m, LAZY_IMPORTERS)}
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycles_between_packages():
    graph: dict[str, set[str]] = {}
    for m in MODULES:
        if m != "flowkit" and not _inside(m, LAZY_IMPORTERS):
            graph.setdefault(_unit(m), set()).update(_unit(d) for d in _edges(m, False) if _unit(d) != _unit(m))
    graph = {u: {d for d in ds if d != "flowkit"} for u, ds in graph.items()}
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "flowkit"))
def test_no_upward_imports(module):
    # At every level: imports inside functions count, as they run all the same.
    level = _layer(_unit(module))
    bad = sorted(d for d in _edges(module, False) if d != "flowkit" and _layer(_unit(d)) > level)
    assert not bad, f"{module} (layer {level}) imports {bad} from a higher layer"


def _private_imports_across_units(module: str) -> set[tuple[str, str, str]]:
    """`(module, imported module, name)` of each private name (`_x`, not `__x__`) `module` imports from another unit.

    Private modules (`flowkit._validation`) are units of their own: importing one is not importing a private name.
    """
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ImportFrom) and (base := _resolve(module, node)) in MODULES:
            for alias in node.names:
                name = alias.name
                private = name.startswith("_") and not name.endswith("__") and f"{base}.{name}" not in MODULES
                if private and _unit(base) != _unit(module):
                    found.add((module, base, name))
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_imported_across_units(module):
    # A leading underscore says "this unit's own": another unit asks for a public name (in its module's __all__).
    bad = sorted(_private_imports_across_units(module))
    assert not bad, f"{module} imports private names of other units: {bad}"


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in MODULES if m != "flowkit"}
    listed = {u for layer in LAYERS for u in layer}
    assert units <= listed, f"units in no layer: {sorted(units - listed)}"
    assert listed <= units, f"layers name units that do not exist: {sorted(listed - units)}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_peer_library_inside_the_package(module):
    bad = sorted(d for d in _imports(module, False) if _inside(d, PEERS))
    assert not bad, f"{module} imports {bad}: peer comparisons belong in bench/"


PACKAGES = sorted(m for m, path in MODULES.items() if path.name == "__init__.py")


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_expose_only_their_public_names(package):
    mod = importlib.import_module(package)
    names = getattr(mod, "__all__", None)
    assert names is not None, f"{package} has no __all__"
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{package}.__all__ lists missing names {missing}"
    private = [n for n in names if n.startswith("_")]
    assert not private, f"{package}.__all__ lists private names {private}"
    extra = [
        n
        for n, value in vars(mod).items()
        if not n.startswith("_") and n not in names and not isinstance(value, (types.ModuleType, __future__._Feature))
    ]
    assert not extra, f"{package} exposes {extra} outside its __all__"


def test_the_package_lists_every_subpackage():
    # Every subpackage (a folder) but the command line, which `flowkit --help` imports alone.
    packages = {m.split(".")[1] for m, path in MODULES.items() if m.count(".") == 1 and path.name == "__init__.py"}
    missing = packages - set(flowkit._SUBPACKAGES) - {"cli"}
    assert not missing, f"subpackages missing from flowkit._SUBPACKAGES: {sorted(missing)}"
    assert set(flowkit._SUBPACKAGES) <= set(flowkit.__all__)


def test_no_flowkit_module_scripts_with_torch_jit():
    """`torch.jit.script` is deprecated (a DeprecationWarning on every use); pyproject.toml filters only torch's own."""
    users = [
        p.relative_to(ROOT) for p in ROOT.rglob("*.py") if "jit.script" in p.read_text() or "jit.trace" in p.read_text()
    ]
    assert not users, users


#: Test folders that stand for something other than a subpackage of flowkit: the benchmark scripts of bench/.
TEST_FOLDERS_BEYOND_THE_PACKAGE = {"bench": "the scripts in bench/", "fixtures": "saved models of earlier commits"}


def test_the_tests_mirror_the_package_layout():
    """tests/NAME/ tests flowkit/NAME/, every subpackage has its folder; top-level modules' tests sit in tests/."""
    tests = Path(__file__).parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    subpackages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert folders - subpackages == set(TEST_FOLDERS_BEYOND_THE_PACKAGE)
    assert subpackages - folders == set(), f"subpackages without a test folder: {sorted(subpackages - folders)}"


def _flow_classes() -> set[str]:
    """The names of `FlowModel` and all its subclasses (`CompiledFlow` among them)."""
    from flowkit.flows.base import FlowModel

    flowkit.io.register_every_class()
    importlib.import_module("flowkit.compiled")
    found, todo = set(), [FlowModel]
    while todo:
        cls = todo.pop()
        found.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return found


def _class_tests(tree: ast.Module, classes: set[str]) -> set[tuple[str, str]]:
    """`(function, class)` for each `isinstance` or `issubclass` in `tree` whose second argument names a flow class."""
    out: set[tuple[str, str]] = set()

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
            second = node.args[1] if len(node.args) == 2 else None
            for item in second.elts if isinstance(second, ast.Tuple) else [second]:
                name = getattr(item, "id", None) or getattr(item, "attr", None)
                if name in classes:
                    out.add((function, name))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return out


def test_no_isinstance_on_a_flow_class_outside_flows():
    """Callers ask the flow contract's abilities (`flowkit.flows.base`) rather than test a model's class.

    Only `flowkit/flows/`, `flowkit/io.py` and a module testing for a class it defines itself may.
    """
    classes = _flow_classes()
    found = set()
    for module, path in MODULES.items():
        if _inside(module, ("flowkit.flows",)) or module == "flowkit.io":
            continue
        tree = ast.parse(path.read_text())
        own = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
        found |= {(module, function) for function, name in _class_tests(tree, classes) if name not in own}
    assert not found, f"isinstance on a flow class (ask the flow contract instead) in {sorted(found)}"


def _option(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser | argparse.Action:
    """The subparser at `path` (`"fit"`, `"bench", "likelihood"`), or its action `--NAME` when `path` ends with one."""
    for name in path:
        if name.startswith("--"):
            return next(a for a in parser._actions if name in a.option_strings)
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


def test_every_preset_is_declared_once_and_the_command_line_and_the_cases_derive_from_it():
    """Issue 39: a preset's name, help and registry case come from its `@preset` declaration, and from nowhere else."""
    from cases import FLOW_PRESETS

    from flowkit.cli import build_parser
    from flowkit.cli.bench import DEFAULT_MODELS, MODELS
    from flowkit.cli.presets import declared_presets
    from flowkit.cli.targets import RENAMED_FLOWS
    from flowkit.flows import registry

    presets = {**registry.PRESETS, **registry.DATA_PRESETS, **registry.IMAGE_PRESETS}
    # What the command line reads from the source (without torch) is what the families' modules register.
    fields = ("kind", "help", "one_pass", "bench", "arguments")
    assert declared_presets() == {name: {f: getattr(p, f) for f in fields} for name, p in sorted(presets.items())}
    assert set(FLOW_PRESETS) == set(presets), "every declared preset has its case in tests/cases.py, and no other"
    parser = build_parser()
    vectors = list(registry.PRESETS)
    one_pass = [name for name, p in registry.PRESETS.items() if p.one_pass]
    assert list(_option(parser, "fit", "--model").choices) == sorted(presets)
    assert list(_option(parser, "fit", "--flow").choices) == vectors
    assert [n for n in _option(parser, "boltzmann", "--flow").choices if n not in RENAMED_FLOWS] == one_pass
    assert set(RENAMED_FLOWS.values()) <= set(one_pass)
    assert list(MODELS) == [f"flowkit-{name}" for name in vectors]
    assert DEFAULT_MODELS == tuple(f"flowkit-{name}" for name, p in registry.PRESETS.items() if p.bench)
    fit_help, boltzmann_help = (" ".join(_option(parser, c).format_help().split()) for c in ("fit", "boltzmann"))
    for name, p in presets.items():
        assert f"{name} {p.help}" in fit_help, f"flowkit fit --help does not show {name}'s declared help"
        assert (f"{name} {p.help}" in boltzmann_help) == (name in one_pass), name
    # No table of preset names in the command line: no tuple, list, set or dict keys naming two or more.
    names = set(presets) | {f"flowkit-{name}" for name in presets}
    for path in sorted((ROOT / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
            named = [i.value for i in items if isinstance(i, ast.Constant) and i.value in names]
            assert len(named) < 2, f"{path.name}:{node.lineno} lists presets {named}: read their declarations"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not _inside(m, LAZY_IMPORTERS)))
def test_no_function_level_import_of_flowkit_outside_the_cli(module):
    # A module's flowkit dependencies are at its top, where the layering tests see them; only the command line
    # imports lazily (a fast `flowkit --help`). Optional or heavy third-party packages may load in a function.
    everywhere = _imports(module, top_level_only=False)
    top = _imports(module, top_level_only=True)
    lazy = sorted(m for m in everywhere - top if m == "flowkit" or m.startswith("flowkit."))
    assert not lazy, f"{module} imports {lazy} inside a function: import them at the top"
