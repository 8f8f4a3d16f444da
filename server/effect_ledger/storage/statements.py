"""Statements built once and reused with bound parameters.

Building a SQLAlchemy statement and computing its cache key costs more Python time than the
database round trip it makes on this hot path; a statement object built once has its cache key
memoized and its compiled form found at once. ``prepared(name, dialect, build)`` keeps one per
name and dialect (the clock expression differs between PostgreSQL and SQLite).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_built: dict[tuple[str, str], Any] = {}


def prepared(name: str, dialect: str, build: Callable[[], Any]) -> Any:
    key = (name, dialect)
    statement = _built.get(key)
    if statement is None:
        statement = _built[key] = build()
    return statement
