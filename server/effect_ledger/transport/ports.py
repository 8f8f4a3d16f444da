"""Whether the port to listen on is free, found with a socket of our own before gRPC binds it.

No grpc import here: the ``--workers`` supervisor checks the port before it starts any worker,
and it never loads the server itself."""

from __future__ import annotations

import errno
import socket


class CannotListen(Exception):
    """The listening address cannot be bound: in use, not an address of this host, or malformed."""


def check_port_free(listen: str, flag: str = "--listen") -> None:
    """CannotListen when something on this host already listens on ``listen``'s port (given
    as ``flag``, which the message names).

    The probe binds without SO_REUSEPORT, so it fails against any socket holding the port, one
    that shares it through SO_REUSEPORT (the workers of another ``serve --workers N``) too.
    Port 0 is always free."""
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]")
    if not port_text.isdigit() or int(port_text) == 0 or not host:
        return  # gRPC decides: port 0 is always free, other forms are its to parse
    try:
        addresses = socket.getaddrinfo(host, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return  # an unresolvable name: gRPC's bind reports it
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            # As gRPC binds: a port whose last connections linger in TIME_WAIT is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise CannotListen(
                        f"cannot listen on {listen}: the port is already in use (another effect-ledger, "
                        f"or another program; give a free {flag} port)"
                    ) from None
                return  # another reason (an address not of this host, ...): gRPC's bind reports it
