"""Who is on the other end of a call, as the transport proved it: the client certificate.

With ``serve --tls-client-ca`` the server requires a client certificate signed by that CA on
every connection (``require_client_auth``: a handshake without one, or with one the CA did not
sign, never completes), and gRPC puts the verified certificate's names in the call's auth
context. Without mTLS there is no client certificate and these functions return None.

The subject is the one gRPC reports, in RFC 2253 form, most specific attribute first:
``CN=agent-7,O=Example\\, Inc`` (what ``cryptography``'s ``Name.rfc4514_string()`` gives for
the same certificate).
"""

from __future__ import annotations

from typing import Any

# A subject or common name longer than this is not one a principal is bound to.
NAME_LENGTH_MAX_BYTES = 1024


def client_subject(context: Any) -> str | None:
    """The verified client certificate's subject, e.g. ``CN=agent-7,O=Example``; None without
    one (plaintext, TLS without client certificates)."""
    return _certificate_property(context, "x509_subject")


def client_common_name(context: Any) -> str | None:
    """The verified client certificate's common name (CN), e.g. ``agent-7``; None without one."""
    return _certificate_property(context, "x509_common_name")


def _certificate_property(context: Any, name: str) -> str | None:
    """One value of the call's auth context (``grpc.ServicerContext.auth_context()``, a dict of
    lists of bytes), only over TLS, and only when there is exactly one."""
    properties = context.auth_context() or {}
    if properties.get("transport_security_type") != [b"ssl"]:
        return None
    values = properties.get(name) or []
    if len(values) != 1 or not values[0] or len(values[0]) > NAME_LENGTH_MAX_BYTES:
        return None
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        return None
