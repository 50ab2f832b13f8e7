"""The import graph, built from the source with `ast` (imports inside functions included): no
cycle between modules, none between the core's modules and the stage packages, and project
imports at the top of modules only (ARCHITECTURE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

PROJECT = "tritonkit"
# Project imports allowed inside functions, as "module: imported module". Keep it empty: an
# import placed in a function to dodge a cycle hides the cycle from whoever reads the module.
# (Heavy optional third-party libraries, such as matplotlib, tensorrt, locust and selenium, may
# still be imported inside functions; they are not project modules.)
INSIDE_FUNCTIONS_ALLOWED: set[str] = set()
# Command wiring sits above every stage: each stage's commands.py, the CLI and the demo.
WIRING = {"commands", "cli", "commandline", "demo"}


def module_files(root: Path = REPO_ROOT) -> dict[str, Path]:
    """Every module of the installed package: tritonkit/ is `tritonkit`, each other top-level
    folder with an __init__.py installs as `tritonkit.<folder>` (pyproject.toml)."""
    out = {}
    for init in sorted(root.glob("*/__init__.py")):
        folder = init.parent
        if folder.name == "tests":
            continue
        package = PROJECT if folder.name == PROJECT else f"{PROJECT}.{folder.name}"
        for f in sorted(folder.glob("*.py")):
            out[package if f.stem == "__init__" else f"{package}.{f.stem}"] = f
    return out


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]):
    """(imported module, line, inside a function) for each project import of a module."""
    package = module if is_package else module.rpartition(".")[0]

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == PROJECT:
                        yield alias.name, child.lineno, in_function
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    target = f"{base}.{child.module}" if child.module else base
                else:
                    target = child.module or ""
                if target.split(".")[0] == PROJECT:
                    for alias in child.names:  # `from pkg import module` imports the module
                        sub = f"{target}.{alias.name}"
                        yield (sub if sub in known else target), child.lineno, in_function
            yield from walk(child, inside)

    yield from walk(tree, False)


def import_graph(root: Path = REPO_ROOT) -> tuple[dict[str, set[str]], list[str]]:
    """Module -> the project modules it imports; and the imports found inside functions."""
    files = module_files(root)
    known = set(files)
    graph: dict[str, set[str]] = {m: set() for m in files}
    inside = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for target, line, in_function in _imports(tree, module, path.stem == "__init__", known):
            if target not in known or target == module:
                continue
            graph[module].add(target)
            if in_function:
                inside.append(f"{module}: {target} ({path.relative_to(root)}:{line})")
    return graph, inside


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def layer_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The core's modules one node each, every stage package one node; command wiring left out."""
    def node(module: str) -> str | None:
        parts = module.split(".")
        if parts[-1] in WIRING:
            return None
        if len(parts) == 2 and module not in stage_packages:
            return module  # a core module, e.g. tritonkit.spec
        return ".".join(parts[:2])

    stage_packages = {m for m in graph if len(m.split(".")) == 2 and any(x.startswith(m + ".") for x in graph)}
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        a = node(module)
        if a is None:
            continue
        out.setdefault(a, set())
        for t in targets:
            b = node(t)
            if b is not None and b != a:
                out[a].add(b)
    return out


def test_the_module_graph_has_no_cycle():
    graph, _ = import_graph()
    assert len(graph) > 50  # every module was found
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_core_and_stages_import_one_way():
    """Between the core's modules and the stage folders (configs, build_engines, tuner, ...) the
    imports go one way; only the command wiring (commands.py, cli, demo) sees every stage."""
    layers = layer_graph(import_graph()[0])
    assert {"tritonkit.spec", "tritonkit.configs", "tritonkit.tuner", "tritonkit.helm"} <= set(layers)
    cycle = find_cycle(layers)
    assert cycle is None, "stages import each other both ways: " + " -> ".join(cycle)


def test_only_the_command_wiring_imports_the_commands():
    graph, _ = import_graph()
    users = {m for m, targets in graph.items() for t in targets if t.endswith(".commands")}
    assert all(u.rsplit(".", 1)[-1] in WIRING for u in users), sorted(users)


def test_project_imports_sit_at_the_top_of_modules():
    _, inside = import_graph()
    unexpected = [i for i in inside if i.split(" (")[0] not in INSIDE_FUNCTIONS_ALLOWED]
    assert not unexpected, "project imports inside functions:\n" + "\n".join(unexpected)


def test_the_graph_finds_a_cycle_through_a_function_level_import(tmp_path):
    """The checker itself: a cycle that hides behind an import inside a function is found."""
    pkg = tmp_path / "tritonkit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from tritonkit import b\n")
    (pkg / "b.py").write_text("def f():\n    from tritonkit.a import x\n")
    graph, inside = import_graph(tmp_path)
    assert find_cycle(graph) == ["tritonkit.a", "tritonkit.b", "tritonkit.a"]
    assert inside == ["tritonkit.b: tritonkit.a (tritonkit/b.py:2)"]


def test_the_benchmarks_sit_above_every_product_stage():
    """`benchmarks/` measures the product; no product module imports it (only the command wiring
    that registers `tritonkit bench`), so no bench-only constant ships in what users import."""
    graph, _ = import_graph()
    bench = {m for m in graph if m.startswith("tritonkit.benchmarks.")}
    assert {"tritonkit.benchmarks.judge", "tritonkit.benchmarks.tuner_bench"} <= bench
    users = {m for m, targets in graph.items() for t in targets
             if t.startswith("tritonkit.benchmarks") and not m.startswith("tritonkit.benchmarks")}
    assert users <= {"tritonkit.cli"}, sorted(users)
