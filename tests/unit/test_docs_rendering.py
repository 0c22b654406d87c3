"""Every list item a page writes is a list item on the docs site.

The pages are written as GitHub reads Markdown, and the site renders them with
Python-Markdown (mkdocs.yml), which reads lists more strictly: a code block, a table or
a second paragraph of an item must be indented four spaces, and an item that follows an
item holding several blocks needs a blank line before it. Otherwise the site folds the
item into the one before, or the block out of its item, and `mkdocs build --strict`
says nothing. So each page is rendered here with the site's extensions, and the
``<li>`` it yields are counted against the lines that start an item.
"""

from __future__ import annotations

import re
from pathlib import Path

import markdown
import pytest

from testproject.harness import REPO_ROOT

# mkdocs.yml's markdown_extensions that shape blocks (the toc's anchors do not).
EXTENSIONS = ["tables", "admonition", "attr_list", "pymdownx.superfences"]
ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.) ")
FENCE = re.compile(r"^\s*(```|~~~)")


def pages() -> list[Path]:
    return [*sorted((REPO_ROOT / "docs").rglob("*.md")), REPO_ROOT / "CHANGELOG.md"]


def items_written(text: str) -> int:
    count, fenced = 0, False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and ITEM.match(line):
            count += 1
    return count


def items_rendered(text: str) -> int:
    html = markdown.markdown(text, extensions=EXTENSIONS)
    return len(re.findall(r"<li[ >]", html))


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_list_item_a_page_writes_renders_as_one(page):
    text = page.read_text(encoding="utf-8")
    assert items_rendered(text) == items_written(text), (
        "indent an item's code, tables and later paragraphs 4 spaces, and put a blank "
        "line before an item that follows an item of several blocks"
    )


def test_the_count_sees_an_item_folded_into_the_one_before():
    folded = "- first\n\n  ```\n  code\n  ```\n\n  more of the first\n- second\n"
    assert items_rendered(folded) < items_written(folded)
    fixed = "- first\n\n    ```\n    code\n    ```\n\n    more of the first\n\n- second\n"
    assert items_rendered(fixed) == items_written(fixed)
