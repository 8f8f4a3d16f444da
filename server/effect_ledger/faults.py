"""Crash points, for the crash tests and nothing else.

``EFFECT_LEDGER_CRASH_AT=<method>.<point>[:<n>]`` makes the server process SIGKILL itself the
n-th time (default 1) it reaches that point, e.g. ``AuthorizeEffect.before_commit:3``. Points:

- ``<Method>.before_commit``: the unit of work is done and its trace events appended, the
  transaction not yet committed (the database must keep nothing of it);
- ``<Method>.after_commit``: committed, the reply not yet sent (the client sees a lost
  connection although the write is durable).

Unset (always, outside tests), a crash point costs one comparison.
"""

from __future__ import annotations

import contextvars
import os
import signal

current_method: contextvars.ContextVar[str] = contextvars.ContextVar("current_method", default="")

_target, _, _nth = os.environ.get("EFFECT_LEDGER_CRASH_AT", "").partition(":")
_remaining = int(_nth or "1")


def armed() -> bool:
    """True when a crash point is set (a test); a path that batches its commit with its write
    then sends them apart, so that ``before_commit`` falls between the two."""
    return bool(_target)


def crash_point(point: str) -> None:
    global _remaining
    if not _target:
        return
    if f"{current_method.get()}.{point}" != _target:
        return
    _remaining -= 1
    if _remaining == 0:
        os.kill(os.getpid(), signal.SIGKILL)
