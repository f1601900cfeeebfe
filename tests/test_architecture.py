"""The package's layering: no import cycles at module level, and the low layers know nothing of the high ones."""

import __future__

import ast
import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import flowkit

ROOT = Path(flowkit.__file__).parent

#: Packages that hold the maths and may not import training, flows, checks or sampling code, at any level.
LOW_LAYERS = ("flowkit.bijectors", "flowkit.transformers", "flowkit.distributions", "flowkit.domains", "flowkit.nn")
HIGH_LAYERS = ("flowkit.flows", "flowkit.testing", "flowkit.train", "flowkit.stochastic", "flowkit.sampling")
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
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return out


def _inside(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_no_import_cycles_at_module_level():
    # A submodule's import of its own ancestor packages is how Python imports it; those edges are not cycles.
    graph = {
        m: {d for d in _imports(m, True) if d in MODULES and not m.startswith(d + ".") and d != m} for m in MODULES
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d) :] + [d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _inside(m, LOW_LAYERS)))
def test_low_layers_do_not_import_high_layers(module):
    bad = sorted(d for d in _imports(module, False) if _inside(d, HIGH_LAYERS))
    assert not bad, f"{module} imports {bad}"


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
