"""Bearer tokens: made here, stored only as their SHA-256."""

from __future__ import annotations

import hashlib
import secrets

from effect_ledger.domain.model import Principal
from effect_ledger.errors import Unauthenticated

TOKEN_PREFIX = "elt_"


def new_token() -> str:
    """A new bearer token: 256 random bits, URL-safe, with a prefix that secret scanners find."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_certificate_binding(principal: Principal, peer_subject: str | None) -> None:
    """A principal bound to a client certificate subject is accepted only over mTLS with a
    certificate of exactly that subject (the token alone is not enough); unbound: any peer."""
    if principal.client_subject is not None and principal.client_subject != peer_subject:
        raise Unauthenticated(
            "this token is bound to a client certificate the call did not present",
            reason="CLIENT_CERTIFICATE_MISMATCH",
        )
