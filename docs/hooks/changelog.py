"""MkDocs hook: the site's changelog page is the repository's CHANGELOG.md.

The changelog lives at the repository root, where GitHub and PyPI readers look for it,
and links the pages as ``docs/<page>.md``. On the site, ``docs/changelog.md`` stands in
for it: at build time this hook replaces that page's Markdown with CHANGELOG.md's,
links rewritten to be relative to ``docs/`` (``docs/api.md#dispatch`` -> ``api.md#dispatch``),
before MkDocs checks the links and anchors. Any other relative link (a file outside
``docs/``) becomes a link to the file in the repository, as the pages themselves do.
So the changelog is written once, and a broken link in it fails ``mkdocs build --strict``
like one in any page.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PAGE = "changelog.md"
SOURCE = "CHANGELOG.md"
REPOSITORY_FILES = "https://github.com/relier-django/relier-django/blob/main/"

# A Markdown inline link's target: ](target) with an optional "title".
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")


def _relink(match: re.Match[str]) -> str:
    target, title = match["target"], match["title"] or ""
    if target.startswith("docs/"):
        target = target.removeprefix("docs/")
    elif not re.match(r"^(#|[a-z][a-z0-9+.-]*:)", target):
        target = REPOSITORY_FILES + target.removeprefix("./")
    return f"]({target}{title})"


def changelog_markdown(root: Path) -> str:
    """CHANGELOG.md under ``root``, its links made relative to ``docs/``."""
    return _LINK.sub(_relink, (root / SOURCE).read_text(encoding="utf-8"))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    return changelog_markdown(Path(config.config_file_path).parent)
