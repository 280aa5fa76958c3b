"""The package's import graph has no cycle, every module imports in a fresh interpreter, and
vitlab never imports the instructor's grader (``vitlab_grader``, in ``grader/``).

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``
anywhere in a module, inside functions too (a cycle hidden in a function-level import is
still a cycle: it only fails later, or in another import order), and
``importlib.import_module`` calls whose name is a literal or starts with one (the
registry's ``f"vitlab.models.{name}"`` points at every model file). Imports under ``if
TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def vitlab_modules() -> dict[str, Path]:
    """Dotted name -> source file, for every module of the package."""
    return {module_name(path): path for path in sorted((ROOT / "vitlab").rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[ast.AST]:
    """Every node under an ``if TYPE_CHECKING:`` block."""
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                skipped.update(ast.walk(statement))
    return skipped


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The module a ``from ... import`` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    parts = importer.split(".") if is_package else importer.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package modules that the module ``name`` (source file ``path``) imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, name, path.name == "__init__.py")
            for alias in node.names:  # `from vitlab import distill` imports the module vitlab.distill
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("importlib.import_module", "import_module"):
            argument = node.args[0] if node.args else None
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                found.add(argument.value)
            elif isinstance(argument, ast.JoinedStr) and argument.values:
                head = argument.values[0]
                if isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.startswith("vitlab"):
                    found.update(m for m in modules if m.startswith(head.value) and m != head.value.rstrip("."))
    return {module for module in found if module in modules and module != name}


def import_graph() -> dict[str, set[str]]:
    modules = vitlab_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


# ---------------------------------------------------------------- the graph reader itself


def test_find_cycle_finds_a_cycle_and_only_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_imports_of_sees_function_level_relative_and_dynamic_imports(tmp_path: Path) -> None:
    source = tmp_path / "registry.py"
    source.write_text(
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "from . import weights\n"
        "if TYPE_CHECKING:\n"
        "    from vitlab.factory import create_model\n"
        "def load():\n"
        "    from vitlab.pretrained import load_released\n"
        "    importlib.import_module(f'vitlab.models.{name}')\n"
    )
    modules = {"vitlab", "vitlab.registry", "vitlab.weights", "vitlab.pretrained", "vitlab.factory"}
    modules |= {"vitlab.models", "vitlab.models.vit", "vitlab.models.deit"}
    found = imports_of("vitlab.registry", source, modules)
    assert found == {"vitlab.weights", "vitlab.pretrained", "vitlab.models.vit", "vitlab.models.deit"}


def test_the_graph_covers_the_package() -> None:
    graph = import_graph()
    assert {"vitlab", "vitlab.registry", "vitlab.pretrained", "vitlab.factory", "vitlab.weights"} <= set(graph)
    assert "vitlab.models.vit" in graph["vitlab.registry"]  # found through import_module
    assert "vitlab.pretrained" in graph["vitlab.factory"]


# ---------------------------------------------------------------- the package


def test_the_package_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("vitlab.registry", {"vitlab.models"}),  # a pure lookup: names, configs, model files
        ("vitlab.weights", set()),  # local file I/O only
        ("vitlab.pretrained", {"vitlab.registry"}),  # the hub, above the registry
    ],
)
def test_the_layers_import_only_what_is_below_them(module: str, allowed: set[str]) -> None:
    graph = import_graph()
    reached = set()
    for target in graph[module]:
        if not any(target == a or target.startswith(a + ".") for a in allowed):
            reached.add(target)
    assert not reached, f"{module} imports {sorted(reached)}; it may import only {sorted(allowed) or 'nothing'}"


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    """One new interpreter imports every module (the graph has no cycle, so any order works), and no grader."""
    names = [name for name in vitlab_modules() if not name.endswith("__main__")]
    code = (
        "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vitlab_grader'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", f"importing vitlab loaded the grader: {result.stdout.strip()}"


# ---------------------------------------------------------------- the grader stays out of vitlab


def imported_modules(source: str, top_level: bool = False) -> list[str]:
    """Every module ``source`` imports by an absolute name, in order: ``import``, ``from ... import``
    and ``import_module``/``__import__`` calls on a literal name; at module level only if
    ``top_level`` (a function's import is optional). A notebook cell's ``%`` and ``!`` lines are skipped."""
    tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
    found = []
    for node in tree.body if top_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append(node.module or "")
        elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("import_module", "__import__"):
            argument = node.args[0] if node.args else None
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                found.append(argument.value)
    return found


def grader_imports(path: Path) -> list[str]:
    """Every ``vitlab_grader`` module that the source file ``path`` imports, at any level or by name."""
    return [name for name in imported_modules(path.read_text()) if name.split(".")[0] == "vitlab_grader"]


def test_grader_imports_finds_every_form_of_import(tmp_path: Path) -> None:
    source = tmp_path / "checks.py"
    source.write_text(
        "import vitlab_grader\nimport os\nfrom vitlab_grader.specs import check_spec\n"
        "def f():\n    import vitlab_grader.harness as h\n    importlib.import_module('vitlab_grader.grade')\n"
        "    __import__('vitlab_grader.ids', fromlist=['x'])\nfrom vitlab import checks\n"
    )
    assert grader_imports(source) == [
        "vitlab_grader", "vitlab_grader.specs", "vitlab_grader.harness", "vitlab_grader.grade", "vitlab_grader.ids",
    ]  # fmt: skip


def test_vitlab_has_no_grading_code_and_never_imports_the_grader() -> None:
    """The grader is its own package (grader/, ``vitlab_grader``) that depends on vitlab; never the other way."""
    found = {name: imports for name, path in vitlab_modules().items() if (imports := grader_imports(path))}
    assert not found, f"vitlab imports the grader: {found}"
    assert not (ROOT / "vitlab" / "assignments").exists(), "the grading code lives in grader/vitlab_grader"
    assert (ROOT / "grader" / "vitlab_grader" / "grade.py").is_file()
