"""The package's import graph: no cycles, and dependencies pointing one way (the layering in
docs/architecture.md, "Dependencies point one way").

The graph is read from the source with `ast` (every `import` / `from ... import` of a jaxscale
module, at any depth, including the lazy ones inside functions), so it is checked without
importing anything. calc/ and sim/ must import nothing of ours but the pure leaf modules, and no
jax: `jaxscale calc` answers instantly.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "jaxscale"
PURE_LEAVES = {"jaxscale.render", "jaxscale.cliutil", "jaxscale.hardware", "jaxscale.checks"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1]
                        + ([base] if base else [])
                    )
                # `from pkg import mod` names a module when pkg.mod exists
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            else:
                continue
            deps.update(t for t in targets if t in modules and t != name)
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of modules (first == last), or None; iterative DFS."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    for start in sorted(graph):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child) :] + [child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and graph["jaxscale.cli"]  # the graph really was read
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


@pytest.mark.parametrize("package", ["jaxscale.calc", "jaxscale.sim"])
def test_calculators_and_simulators_import_only_pure_modules(package):
    graph = import_graph()
    for name, deps in graph.items():
        if name == package or name.startswith(package + "."):
            foreign = {d for d in deps if not d.startswith(package) and d not in PURE_LEAVES}
            assert not foreign, f"{name} imports {sorted(foreign)}"


# The layers below may not import the ones above: the model knows no strategy, and a strategy
# knows no training loop, server or RL algorithm (training, serving and RLHF stand on both).
LAYERS_ABOVE = {
    "jaxscale.model": ("parallel", "train", "serve", "rl", "rlhf", "bench", "verify"),
    "jaxscale.parallel": ("train", "serve", "rl", "rlhf", "bench", "verify"),
}


@pytest.mark.parametrize("package", sorted(LAYERS_ABOVE))
def test_lower_layers_do_not_import_higher_ones(package):
    above = tuple(f"jaxscale.{name}" for name in LAYERS_ABOVE[package])
    for name, deps in import_graph().items():
        if name == package or name.startswith(package + "."):
            up = {d for d in deps if d.startswith(above)}
            assert not up, f"{name} imports {sorted(up)}"


def test_pure_leaves_import_nothing_of_ours():
    graph = import_graph()
    for leaf in PURE_LEAVES:
        assert graph[leaf] == set(), (leaf, graph[leaf])


@pytest.mark.smoke
def test_calc_and_simulate_start_without_jax():
    code = (
        "import sys; from jaxscale.cli import build_parser; build_parser(); "
        "import jaxscale.calc.advisor, jaxscale.sim.pipeline; "
        "print('jax' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
