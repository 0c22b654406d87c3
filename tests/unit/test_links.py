"""The docs URL that errors and hints name is the one the package metadata publishes,
and every page they link exists."""

from __future__ import annotations

import configparser
import re

from relier_django.core.model import links
from testproject.harness import REPO_ROOT


def test_hints_point_at_the_documentation_url_of_the_package_metadata():
    metadata = configparser.ConfigParser()
    metadata.read(REPO_ROOT / "setup.cfg")
    urls = dict(
        line.split("=", 1) for line in metadata["metadata"]["project_urls"].strip().splitlines()
    )
    assert urls["Documentation "].strip() == links.DOCS_URL
    assert links.doc("settings.md", "system-checks") == (
        "https://github.com/relier-django/relier-django/blob/main/docs/settings.md#system-checks"
    )
    for page in ("settings.md", "workflows.md", "from-celery.md", "results.md", "scheduling.md"):
        assert (REPO_ROOT / "docs" / page).is_file(), page  # every page a message names


def test_every_page_a_message_links_exists_in_docs():
    pages = set()
    for path in (REPO_ROOT / "relier_django").rglob("*.py"):
        pages |= set(re.findall(r"""\bdoc\(\s*["']([\w./-]+\.md)["']""", path.read_text()))
    assert pages, "no links.doc() call found: the pattern is stale"
    missing = sorted(p for p in pages if not (REPO_ROOT / "docs" / p).is_file())
    assert missing == []
