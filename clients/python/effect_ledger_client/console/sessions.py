"""The console's sessions: a random id in the cookie, everything else in this process's memory.

A session holds the signed-in principal's bearer token, its gRPC client and the synchronizer
token that every POST form must carry back. Nothing is written anywhere: a restart of the
console signs everyone out. Both tables are bounded; when one is full its least recently used
session is dropped.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

SESSION_ID_BYTES = 32
CSRF_TOKEN_BYTES = 32
# A session id as the cookie carries it (token_urlsafe of 32 bytes is 43 characters).
SESSION_ID_LENGTH_MAX = 64
FLASHES_PER_SESSION_MAX = 8


@dataclass
class Session:
    session_id: str
    csrf_token: str
    created_at_monotonic: float
    used_at_monotonic: float
    # None until the token was accepted by the gate.
    token: str | None = None
    # The session's AsyncLedger (created at sign-in, closed when the session ends).
    ledger: Any = None
    flashes: list[tuple[str, str]] = field(default_factory=list)

    @property
    def signed_in(self) -> bool:
        return self.token is not None

    def flash(self, kind: str, text: str) -> None:
        self.flashes = [*self.flashes, (kind, text)][-FLASHES_PER_SESSION_MAX:]

    def take_flashes(self) -> list[tuple[str, str]]:
        taken, self.flashes = self.flashes, []
        return taken

    def csrf_matches(self, offered: str) -> bool:
        return hmac.compare_digest(self.csrf_token.encode(), offered.encode())


@dataclass(frozen=True)
class SessionLimits:
    # Signed-in sessions held at once, and how long one lives unused and at most.
    signed_in_max: int = 1000
    idle_seconds_max: float = 30 * 60
    lifetime_seconds_max: float = 12 * 60 * 60
    # Sessions of visitors who have not signed in yet (they only hold a CSRF token).
    anonymous_max: int = 1000
    anonymous_seconds_max: float = 10 * 60


class SessionTable:
    """Sessions by id, bounded, with expiry; the sessions it drops wait in ``dropped`` until
    ``take_dropped`` (the console closes their gRPC channels)."""

    def __init__(self, limits: SessionLimits, clock=time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._anonymous: OrderedDict[str, Session] = OrderedDict()
        self._signed_in: OrderedDict[str, Session] = OrderedDict()
        self.dropped: list[Session] = []

    def new_anonymous(self) -> Session:
        now = self._clock()
        session = Session(
            session_id=secrets.token_urlsafe(SESSION_ID_BYTES),
            csrf_token=secrets.token_urlsafe(CSRF_TOKEN_BYTES),
            created_at_monotonic=now,
            used_at_monotonic=now,
        )
        self._insert(self._anonymous, session, self.limits.anonymous_max)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session for a cookie's id (its use recorded), or None."""
        if not session_id or len(session_id) > SESSION_ID_LENGTH_MAX:
            return None
        now = self._clock()
        for table in (self._signed_in, self._anonymous):
            session = table.get(session_id)
            if session is None:
                continue
            if self._expired(session, now):
                self._drop(table, session_id)
                return None
            session.used_at_monotonic = now
            table.move_to_end(session_id)
            return session
        return None

    def sign_in(self, session: Session, token: str, ledger: Any) -> Session:
        """A new signed-in session (a fresh id and CSRF token) replacing ``session``."""
        self._anonymous.pop(session.session_id, None)
        now = self._clock()
        signed = Session(
            session_id=secrets.token_urlsafe(SESSION_ID_BYTES),
            csrf_token=secrets.token_urlsafe(CSRF_TOKEN_BYTES),
            created_at_monotonic=now,
            used_at_monotonic=now,
            token=token,
            ledger=ledger,
        )
        self._insert(self._signed_in, signed, self.limits.signed_in_max)
        return signed

    def end(self, session: Session) -> None:
        for table in (self._signed_in, self._anonymous):
            if session.session_id in table:
                self._drop(table, session.session_id)

    def end_all(self) -> None:
        for table in (self._signed_in, self._anonymous):
            for session_id in list(table):
                self._drop(table, session_id)

    def sweep(self) -> None:
        """Drops every expired session."""
        now = self._clock()
        for table in (self._signed_in, self._anonymous):
            for session_id in [key for key, value in table.items() if self._expired(value, now)]:
                self._drop(table, session_id)

    def take_dropped(self) -> list[Session]:
        dropped, self.dropped = self.dropped, []
        return dropped

    def __len__(self) -> int:
        return len(self._signed_in) + len(self._anonymous)

    def _expired(self, session: Session, now: float) -> bool:
        if not session.signed_in:
            return now - session.created_at_monotonic > self.limits.anonymous_seconds_max
        return (
            now - session.used_at_monotonic > self.limits.idle_seconds_max
            or now - session.created_at_monotonic > self.limits.lifetime_seconds_max
        )

    def _insert(self, table: OrderedDict[str, Session], session: Session, size_max: int) -> None:
        while len(table) >= size_max:
            oldest = next(iter(table))
            self._drop(table, oldest)
        table[session.session_id] = session

    def _drop(self, table: OrderedDict[str, Session], session_id: str) -> None:
        session = table.pop(session_id)
        session.token = None
        self.dropped.append(session)
