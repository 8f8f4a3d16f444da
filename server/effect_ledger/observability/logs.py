"""Log lines: text or JSON, one renderer for structlog's lines and the standard library's.

Every line goes through one handler on the root logger whose formatter is structlog's
``ProcessorFormatter``: lines logged with ``logging.getLogger(...)`` and lines logged with
``structlog.stdlib.get_logger(...)`` get the same fields and the same rendering, so in JSON
mode every line is one JSON object.

- text: ``<time> <LEVEL> [worker N pid P] <logger> <message> key=value ...`` (the worker label
  only in a worker process; key=value pairs only for structured fields, a list as
  ``key=A,B``);
- json: ``{"timestamp", "level", "logger", "event", ...fields}``, with ``worker`` and ``pid`` in
  a worker process and ``exception`` (the formatted traceback) when one is logged.

A line logged while a call is in progress carries the call's ``request_id``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, TextIO

import structlog

from effect_ledger.observability import calls

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# The logger of the one line per call (observer.py).
ACCESS_LOGGER = "effect_ledger.access"
# A text line's values are quoted when they hold a space, a quote or an equals sign.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@+,")


class BadLogSetting(Exception):
    """A --log-format or --log-level the server does not know."""


def _add_request_id(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    state = calls.current.get()
    if state is not None and "request_id" not in event_dict:
        event_dict["request_id"] = state.request_id
    return event_dict


def _text_value(value: Any) -> str:
    """A value as it stands in a text line; a list or tuple as its items joined by commas."""
    if isinstance(value, list | tuple):
        text = ",".join(str(item) for item in value)
    else:
        text = value if isinstance(value, str) else str(value)
    if text and all(character in _PLAIN for character in text):
        return text
    return json.dumps(text)


class _TextRenderer:
    """``<time> <LEVEL> <label><logger> <message> key=value ...``, and a traceback below it."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __call__(self, logger: Any, method_name: str, event_dict: dict[str, Any]) -> str:
        timestamp = event_dict.pop("timestamp", "")
        level = str(event_dict.pop("level", method_name)).upper()
        name = event_dict.pop("logger", "")
        event = event_dict.pop("event", "")
        exception = event_dict.pop("exception", None)
        event_dict.pop("worker", None)
        event_dict.pop("pid", None)
        line = f"{timestamp} {level} {self.label}{name} {event}"
        if event_dict:
            line += " " + " ".join(f"{key}={_text_value(value)}" for key, value in event_dict.items())
        if exception:
            line += "\n" + str(exception)
        return line


# This process's worker index under a supervisor, and its pid; set by ``configure``.
_worker: tuple[int, int] | None = None


def _add_worker(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    if _worker is not None:
        event_dict["worker"], event_dict["pid"] = _worker
    return event_dict


# What every line gets, whether logged through structlog or the standard library.
_CHAIN: list[Any] = [
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    _add_request_id,
    _add_worker,
]
# Set once, here: structlog's lines become standard library records, rendered by the handler
# ``configure`` installs (or by whatever handler a test harness has).
structlog.configure(
    processors=[structlog.stdlib.filter_by_level, *_CHAIN, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=True,
)


def check_settings(log_format: str, level: str) -> None:
    if log_format not in LOG_FORMATS:
        raise BadLogSetting(f"--log-format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    if level.upper() not in LOG_LEVELS:
        raise BadLogSetting(f"--log-level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")


def configure(
    log_format: str = "text", level: str = "INFO", *, worker: int | None = None, stream: TextIO | None = None
) -> None:
    """Send every line to ``stream`` (standard error) in ``log_format``; ``worker``: this process
    is worker ``worker`` of a supervisor (its lines say so). Called again, it replaces the setup."""
    global _worker
    check_settings(log_format, level)
    _worker = None if worker is None else (worker, os.getpid())
    renderer: Any
    if log_format == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = _TextRenderer(f"[worker {worker} pid {os.getpid()}] " if worker is not None else "")
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_CHAIN,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Migrations say what they do at INFO; an operator needs only their failures.
    logging.getLogger("alembic").setLevel(logging.WARNING)


def get_logger(name: str) -> Any:
    """A structlog logger whose lines go through ``configure``'s handler."""
    return structlog.stdlib.get_logger(name)


def cause_of(error: BaseException, length_max: int = 2000) -> str:
    """What lies under ``error``: each exception it was raised from (or during), as
    ``Type: text``, joined by `` <- ``. For the server's log only: it may name hosts, ports and
    files, which a client is never told."""
    parts: list[str] = []
    seen = {id(error)}
    under = error.__cause__ or error.__context__
    while under is not None and id(under) not in seen and len(parts) < 8:
        seen.add(id(under))
        text = str(under)
        parts.append(f"{type(under).__name__}: {text}" if text else type(under).__name__)
        under = under.__cause__ or under.__context__
    return " <- ".join(parts)[:length_max]
