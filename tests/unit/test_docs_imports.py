"""No page tells a user to import from ``relier_django.core``, and every import a page
shows works.

``relier_django.core`` is the package's inside (STYLE.md, the layers in setup.cfg): it is
reorganised from one release to the next, so code that imports from it breaks on an
upgrade. What a user types comes from ``relier_django`` itself (``rl_task``, ``lock``,
``cancel``, the errors, ...) or from one of its top-level modules
(``relier_django.testing``, ``relier_django.transport``, ``relier_django.signals``, ...).

The rule, over every page the docs site is built from (``docs/**/*.md``), README.md and
CHANGELOG.md (a page of the site too):

1. No dotted name into the core anywhere on a page, in prose, inline code or a code
   block: ``relier_django.core`` followed by ``.``, ``:`` or the end of the name. That
   covers an import (``from relier_django.core.extras.lock import lock``, ``import
   relier_django.core``), a dotted path (``relier_django.core.model.errors.TaskFailed``)
   and an entry point (``relier_django.core.broker.redis_channel:Transport``). A relative
   import into it (``from .core import ...``) in a code block is refused too.
2. Outside the design pages (``DESIGN_PAGES``: the architecture, the guarantees map, the
   chaos suite and the test suite, which describe the package's internals), no
   shortened dotted name into the core in inline code or a code block either:
   ``core.<name>`` not preceded by a dot or a word character (``django.core.cache`` is
   not one), e.g. ``core.observe.task.read_task``.
3. A file path is allowed on any page: ``relier_django/core/store/keys.py`` or
   ``core/worker/pool_order.py``, with slashes, names a file to read (and a traceback shows
   one), not a module to import.

And every ``from relier_django... import ...`` / ``import relier_django...`` that a page
shows, in a code block (comments included: ``# or: from ... import ...``) or in inline
code, imports: the module exists and has each name.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from testproject.harness import REPO_ROOT

DOCS = REPO_ROOT / "docs"
DESIGN_PAGES = frozenset({"architecture.md", "guarantees.md", "chaos.md", "test-suite.md"})

CORE_DOTTED = re.compile(r"\brelier_django\.core(?=[.:]|\b)")
CORE_RELATIVE = re.compile(r"\bfrom\s+\.+core\b")
CORE_SHORT = re.compile(r"(?<![\w./])core\.[a-z_]\w*")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
FROM_IMPORT = re.compile(
    r"\bfrom\s+(relier_django(?:\.\w+)*)\s+import\s+(\([^)]*\)|[\w ,]+(?:\s+as\s+\w+)?)"
)
PLAIN_IMPORT = re.compile(r"^\s*import\s+(relier_django(?:\.\w+)*)\b")


def pages() -> list[Path]:
    found = sorted(DOCS.rglob("*.md"))
    assert len(found) > 20, "no docs pages found: the path is stale"
    return [*found, REPO_ROOT / "README.md", REPO_ROOT / "CHANGELOG.md"]


def _name(page: Path) -> str:
    return page.relative_to(REPO_ROOT).as_posix()


@dataclass(frozen=True)
class Code:
    page: str
    line: int
    text: str
    block: bool  # a line of a fenced code block; else one inline code span


def code_of(text: str, page: str) -> list[Code]:
    """Every line of the page's fenced code blocks, and every inline code span outside
    them, with its line number."""
    found: list[Code] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            found.append(Code(page, number, line, block=True))
        else:
            found += [Code(page, number, m[2], block=False) for m in INLINE_CODE.finditer(line)]
    # An import over several lines inside parentheses: joined, so its names are seen.
    joined = re.sub(r"\(\s*([^)]*?)\s*\)", lambda m: "(" + " ".join(m[1].split()) + ")", text)
    if joined != text:
        found += [
            Code(page, 0, m[0], block=True)
            for m in FROM_IMPORT.finditer(joined)
            if "\n" in m[0] or "(" in m[0]
        ]
    return found


def violations(text: str, page: str) -> list[str]:
    """Where ``text`` (the page named ``page``) breaks rules 1 and 2, as
    ``page:line: text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if CORE_DOTTED.search(line):
            found.append(f"{page}:{number}: {line.strip()}")
    for code in code_of(text, page):
        if code.block and CORE_RELATIVE.search(code.text):
            found.append(f"{page}:{code.line}: {code.text.strip()}")
        if Path(page).name not in DESIGN_PAGES and CORE_SHORT.search(code.text):
            found.append(f"{page}:{code.line}: {code.text.strip()}")
    return found


def imports(text: str, page: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(where, module, names) for each import from relier_django a page shows."""
    found = []
    for code in code_of(text, page):
        where = f"{code.page}:{code.line}"
        for module, names in FROM_IMPORT.findall(code.text):
            wanted = tuple(
                n.split(" as ")[0].strip()
                for n in names.strip("()").split(",")
                if n.strip() and n.strip() != "*"
            )
            found.append((where, module, wanted))
        if code.block and (m := PLAIN_IMPORT.match(code.text)):
            found.append((where, m[1], ()))
    return found


@pytest.mark.parametrize("page", pages(), ids=_name)
def test_no_page_points_users_into_relier_django_core(page):
    assert violations(page.read_text(encoding="utf-8"), _name(page)) == [], (
        "use the public path: relier_django (its __init__ exports), or a top-level module "
        "such as relier_django.testing; name a file of the core as a path with slashes"
    )


def test_every_import_a_page_shows_imports():
    shown = [i for page in pages() for i in imports(page.read_text(encoding="utf-8"), _name(page))]
    assert len(shown) > 10, "hardly any import found in the docs: the pattern is stale"
    broken = []
    for where, module, names in shown:
        try:
            imported = importlib.import_module(module)
        except ImportError as exc:
            broken.append(f"{where}: {module}: {exc}")
            continue
        broken += [f"{where}: {module} has no {n}" for n in names if not _has(imported, n)]
    assert broken == []


def _has(module: object, name: str) -> bool:
    """What ``from module import name`` finds: an attribute, else a submodule."""
    if hasattr(module, name):
        return True
    try:
        importlib.import_module(f"{module.__name__}.{name}")  # type: ignore[attr-defined]
    except ImportError:
        return False
    return True


@pytest.mark.parametrize(
    "line",
    [
        "from relier_django.core.extras.lock import lock",
        "import relier_django.core",
        "the errors are in `relier_django.core.model.errors`.",
        'CELERY_BROKER_TRANSPORT = "relier_django.core.broker.redis_channel:Transport"',
        "```python\nfrom .core.model import events\n```",
        "which calls `core.observe.task.read_task`",
    ],
)
def test_the_rule_catches_an_import_path_or_dotted_name_into_the_core(line):
    assert violations(line, "docs/a-user-page.md") != []


@pytest.mark.parametrize(
    "line",
    [
        "from relier_django import lock",
        "from relier_django.testing import capture_pushes",
        "in one place (`relier_django/core/store/connection.py`)",
        "(`core/worker/pool_order.py`), so it starts",
        'File "/srv/app/relier_django/core/worker/runner.py", line 99',
        "`django.core.cache.backends.redis.RedisCache`",
        "relier_django.coreless is not the core",
    ],
)
def test_the_rule_lets_public_paths_and_file_paths_through(line):
    assert violations(line, "docs/a-user-page.md") == []


def test_a_design_page_may_name_the_cores_rooms_in_code():
    assert violations("`core.task`: the composition root", "docs/architecture.md") == []


def test_imports_are_read_from_code_blocks_comments_inline_code_and_parentheses():
    text = (
        "Use `from relier_django import lock`.\n\n"
        "```python\n"
        "from relier_django.testing import capture_pushes\n"
        "# or: from relier_django.testing import relier_eager, relier_pushes\n"
        "from relier_django import (\n    rl_task,\n    TaskContext as Ctx,\n)\n"
        "import relier_django.signals\n"
        "```\n"
    )
    found = {(module, names) for _, module, names in imports(text, "docs/x.md")}
    assert found == {
        ("relier_django", ("lock",)),
        ("relier_django.testing", ("capture_pushes",)),
        ("relier_django.testing", ("relier_eager", "relier_pushes")),
        ("relier_django", ("rl_task", "TaskContext")),
        ("relier_django.signals", ()),
    }
