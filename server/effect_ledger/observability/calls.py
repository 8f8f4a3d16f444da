"""The call in progress: its request id, who made it, and how it ended.

The guard starts a ``CallState`` for every guarded call and keeps it in a context variable, so
whatever runs for the call (its servicer, the unit of work, the policy engine, a log line) finds
it. The state is one mutable object: tasks the call starts copy the context, not the object, so
what they learn (who the caller is) reaches the guard.
"""

from __future__ import annotations

import random
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

# The metadata key of the request id, both ways: read from the request, sent back in the trailers.
REQUEST_ID_KEY = "x-request-id"
REQUEST_ID_LENGTH_MAX = 128
# Visible ASCII only: a request id lands in log lines and trailers as it is.
_REQUEST_ID_FIRST = 0x21
_REQUEST_ID_LAST = 0x7E
# Not a secret, only unique enough to find a call's lines: a fast generator, seeded per process
# from the operating system's randomness.
_random = random.Random()


@dataclass
class CallState:
    method: str = ""
    request_id: str = ""
    # Who the call authenticated as (``guard.authenticated_as``): its errors may now speak of its
    # request. None until then.
    principal_id: str | None = None
    # Who made the call, for its access line: known once any path checked its token (the guard,
    # a unit of work, or a fast path that authenticates in its first round trip).
    tenant_id: str = ""
    caller_id: str = ""
    # The tenant this call's token belonged to when it last checked out on this process (the
    # guard remembers it), before the token is checked again: a hint, never an authority.
    tenant_hint: str = ""
    # How it ended: a gRPC status code name and the error's reason; the unary response.
    code: str = "OK"
    reason: str = ""
    response: Any = None
    # The call's trace (hex), when tracing is on.
    trace_id: str = ""

    def identify(self, tenant_id: str, principal_id: str) -> None:
        """The call is made by this principal (its token checked out)."""
        self.tenant_id = tenant_id
        self.caller_id = principal_id


current: ContextVar[CallState | None] = ContextVar("effect_ledger_call", default=None)


def identify(tenant_id: str, principal_id: str) -> None:
    """The call in progress is made by this principal (its token checked out)."""
    state = current.get()
    if state is not None:
        state.identify(tenant_id, principal_id)


def new_request_id() -> str:
    return f"{_random.getrandbits(64):016x}"


def is_valid_request_id(value: str) -> bool:
    if not value or len(value) > REQUEST_ID_LENGTH_MAX:
        return False
    return all(_REQUEST_ID_FIRST <= ord(character) <= _REQUEST_ID_LAST for character in value)


def request_id_of(metadata: Any) -> str:
    """The caller's ``x-request-id`` when it is one (1 to 128 visible ASCII characters);
    otherwise a new one."""
    for key, value in metadata or ():
        if key == REQUEST_ID_KEY:
            if isinstance(value, str) and is_valid_request_id(value):
                return value
            break
    return new_request_id()
