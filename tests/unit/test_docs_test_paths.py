"""Every test file a page names exists: docs/guarantees.md maps each promise to its
test by path, and a test moved without its page would leave a promise unproven on
paper. (The suite's folders move; the pages must follow.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "CHANGELOG.md"])
TEST_PATH = re.compile(r"\btests/[\w/]+\.py\b")

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_test_file_a_page_names_exists(page: Path) -> None:
    named = set(TEST_PATH.findall(page.read_text()))
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"{page.name} names test files that do not exist: {missing}"
