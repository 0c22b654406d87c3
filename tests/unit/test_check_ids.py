"""Every system check id relier_django emits is documented once in docs/checks.md's
table, and the table names no id the code does not emit: an id given two meanings, or
a check nobody can look up, fails here."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from testproject.harness import REPO_ROOT

pytestmark = pytest.mark.unit

ID = r"relier\.[EWI]\d{3}"


def _emitted() -> set[str]:
    found: set[str] = set()
    for path in (REPO_ROOT / "relier_django").rglob("*.py"):
        found |= set(re.findall(rf'id="({ID})"', path.read_text()))
    return found


def _documented() -> Counter[str]:
    table = (REPO_ROOT / "docs" / "checks.md").read_text()
    return Counter(re.findall(rf"^\| `({ID})` \|", table, re.M))


def test_each_emitted_check_id_has_one_row_in_the_checks_table() -> None:
    documented = _documented()
    assert [i for i, n in documented.items() if n > 1] == []
    assert sorted(_emitted()) == sorted(documented)
