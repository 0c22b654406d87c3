"""The house rules that lint cannot state: one owner per script, no import cycle."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import grimp

from relier_django.core.store import scripts

PACKAGE = Path(__file__).resolve().parents[2] / "relier_django"


def _constant(script: scripts.LuaScript) -> str:
    return next(name for name, value in vars(scripts).items() if value is script and name.isupper())


def test_every_script_file_is_loaded_and_has_an_owner():
    folder = resources.files("relier_django.core.store").joinpath("lua")
    files = {p.name[:-4] for p in folder.iterdir() if p.name.endswith(".lua")}
    operations = {name for name in files if not name.startswith("_")}  # _x: included fragments
    assert {s.name for s in scripts.ALL} == operations
    assert set(scripts.OWNERS) == set(scripts.ALL)


def test_each_script_is_called_from_its_owner_only():
    sources = {
        ".".join(p.relative_to(PACKAGE / "core").with_suffix("").parts): p.read_text()
        for p in (PACKAGE / "core").rglob("*.py")
    }
    sources.update(
        {f"django:{p.name}": p.read_text() for p in PACKAGE.rglob("*.py") if "core" not in p.parts}
    )
    for script, owner in scripts.OWNERS.items():
        word = re.compile(rf"\bscripts\.{_constant(script)}\b")
        callers = {m for m, text in sources.items() if word.search(text)} - {"store.scripts"}
        assert callers == {owner}, f"{script.name}.lua: called from {sorted(callers)}"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
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
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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


def test_no_import_cycle_in_the_package():
    # Type-only and function-level imports count too: a cycle hidden there is a cycle.
    graph = grimp.build_graph("relier_django")
    edges = {
        m: {i for i in graph.find_modules_directly_imported_by(m) if i.startswith("relier_django")}
        for m in graph.modules
        if m.startswith("relier_django")
    }
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
