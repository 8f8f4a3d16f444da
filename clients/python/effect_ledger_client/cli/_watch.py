"""Following a server stream of sequenced events (``approvals watch``, ``schedules watch``):
stream after stream, each resumed after the last sequence printed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from effect_ledger_client.cli._app import Ctl
from effect_ledger_client.cli._render import View
from effect_ledger_client.errors import DeadlineExceeded

# Without --seconds, a watch asks for a stream this long and opens the next one when it ends.
WATCH_STREAM_SECONDS = 3600.0
# A server ends long streams itself; a watch opens at most this many in a row.
WATCH_STREAMS_MAX = 100_000


def deadline_of(seconds: float | None) -> float | None:
    return time.monotonic() + seconds if seconds is not None else None


def follow(
    ctl: Ctl,
    open_stream: Callable[..., Any],
    request: Message,
    view: View,
    deadline: float | None,
    max_events: int | None,
) -> None:
    """Prints each event of ``open_stream(request)`` and sets the request's ``after_sequence``
    to its ``sequence`` (and clears ``from_now``); opens the next stream when one ends, until the
    deadline or ``max_events``."""
    printed = 0
    # A request "from now" (WatchApprovals) keeps asking from now until its first event: a new
    # stream before then starts after the tenant's latest event again.
    from_now = "from_now" in request.DESCRIPTOR.fields_by_name
    for _ in range(WATCH_STREAMS_MAX):
        remaining = deadline - time.monotonic() if deadline is not None else WATCH_STREAM_SECONDS
        if remaining <= 0 or (max_events is not None and printed >= max_events):
            return
        stream = open_stream(request, timeout=remaining)
        try:
            for event in stream:
                ctl.printer.event(event, view)
                request.after_sequence = event.sequence  # type: ignore[attr-defined]
                if from_now:  # the next stream resumes from this event, no longer "from now"
                    request.from_now = False  # type: ignore[attr-defined]
                printed += 1
                if max_events is not None and printed >= max_events:
                    return
        except DeadlineExceeded:
            pass  # this stream's time is up; the loop checks the watch's own
        finally:
            stream.cancel()
