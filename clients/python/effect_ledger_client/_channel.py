"""Channel credentials: TLS from PEM bytes or file paths, or plaintext without them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import grpc

# PEM bytes, or the path of a PEM file.
Pem = bytes | str | os.PathLike
# A CA bundle, a certificate chain or a key is a few KiB; a larger file is not one of those.
PEM_FILE_SIZE_MAX_BYTES = 1024 * 1024
# The ledger's messages stop at 4 MiB; the channel accepts as much.
MESSAGE_SIZE_MAX_BYTES = 4 * 1024 * 1024


def channel_credentials(
    root_certificates: Pem | None = None,
    client_certificate: Pem | None = None,
    client_key: Pem | None = None,
) -> grpc.ChannelCredentials | None:
    """TLS credentials, or None when no option is given (plaintext)."""
    if (client_certificate is None) != (client_key is None):
        raise ValueError("client_certificate and client_key come together")
    if root_certificates is None and client_certificate is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_pem(root_certificates),
        private_key=_pem(client_key),
        certificate_chain=_pem(client_certificate),
    )


def channel_options(extra: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", MESSAGE_SIZE_MAX_BYTES),
        ("grpc.max_send_message_length", MESSAGE_SIZE_MAX_BYTES),
        *extra,
    ]


def _pem(value: Pem | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as file:
        data = file.read(PEM_FILE_SIZE_MAX_BYTES + 1)
    if len(data) > PEM_FILE_SIZE_MAX_BYTES:
        raise ValueError(f"{os.fspath(value)}: larger than {PEM_FILE_SIZE_MAX_BYTES} bytes, not a PEM file")
    return data
