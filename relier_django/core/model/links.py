"""Where the documentation lives, for the errors and hints that send a user to it.

The docs are not in the installed package, so a message names their published URL,
the one the package metadata gives as its Documentation URL (setup.cfg's
``project_urls``; tests/unit/test_links.py keeps the two equal).
"""

from __future__ import annotations

DOCS_URL = "https://github.com/relier-django/relier-django/tree/main/docs"


def doc(page: str, anchor: str = "") -> str:
    """The URL of ``page`` (e.g. ``"settings.md"``), at ``anchor`` when given."""
    url = f"{DOCS_URL.replace('/tree/', '/blob/')}/{page}"
    return f"{url}#{anchor}" if anchor else url
