"""The databases the database tests run on: SQLite ("default") and the session's private
PostgreSQL ("pg", which tests/conftest.py adds unless TESTPROJECT_POSTGRES_URL is
empty), and the marks that run a test on each with real commits."""

from __future__ import annotations

import pytest
from django.conf import settings

HAVE_PG = "pg" in settings.DATABASES
PG_SKIP = "TESTPROJECT_POSTGRES_URL is empty, which turns PostgreSQL off: SQLite only"
DATABASES = ["default", "pg"] if HAVE_PG else ["default"]
PG = pytest.mark.skipif(not HAVE_PG, reason=PG_SKIP)
ALIASES = pytest.mark.parametrize("alias", ["default", pytest.param("pg", marks=PG)])
COMMITS = pytest.mark.django_db(transaction=True, databases=DATABASES)


class Rollback(Exception):
    """Raised to roll a block back."""
