"""Passwords out of URLs, for anything printed: logs, errors, pages, ``repr``.

Layer 1 (no relier imports), so that ``config`` can use it in ``Config.__repr__`` and
``connection`` can re-export it.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Query parameters whose values are secrets (redis-py passes unknown ones through as
# connection arguments, so ``?password=`` works and must be hidden too).
_SECRET_PARAMS = frozenset({"password", "ssl_password", "sentinel_password"})


def redact(url: str) -> str:
    """``url`` with every password replaced by ``***``.

    Covers the ``user:password@`` part and secret query parameters (``?password=``).
    Never raises: a URL it cannot parse is masked from the scheme to the last ``@``.
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            host = parts.hostname or ""
            host = f"[{host}]" if ":" in host else host
            port = f":{parts.port}" if parts.port else ""
            netloc = f"{parts.username or ''}:***@{host}{port}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(k in _SECRET_PARAMS for k, _ in pairs):
                query = urlencode([(k, "***" if k in _SECRET_PARAMS else v) for k, v in pairs])
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:  # e.g. a port that is not a number
        return re.sub(r"//.*@", "//***@", url)
