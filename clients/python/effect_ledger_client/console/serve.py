"""``effect-ledger-console``: serves the reviewer's console (uvicorn) in front of one gate.

    effect-ledger-console --listen 127.0.0.1:8080 --server 127.0.0.1:50051 \\
        [--root-certificates ca.pem] [--client-certificate c.pem --client-key c-key.pem] \\
        [--tls-cert console.pem --tls-key console-key.pem] [--secure-cookies] [--insecure]

It needs the ``console`` extra (starlette, jinja2, uvicorn, ...); without it the command says
what to install, in one line, and exits with ``EXIT_MISSING_EXTRA``, as ``effect-ledger-ctl`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import socket
import sys
from pathlib import Path

# sessions needs only the standard library: without the extra this module still imports, and says
# what is missing (main).
from effect_ledger_client.console.sessions import SessionLimits

EXIT_MISSING_EXTRA = 1


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="effect-ledger-console", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT the console serves on")
    parser.add_argument("--server", default="127.0.0.1:50051", help="HOST:PORT of the gate (gRPC)")
    parser.add_argument("--root-certificates", help="CA bundle (PEM): speak TLS to the gate")
    parser.add_argument("--client-certificate", help="client certificate chain (PEM), for mTLS")
    parser.add_argument("--client-key", help="the client certificate's key (PEM), for mTLS")
    parser.add_argument("--tls-cert", help="serve the console over HTTPS with this certificate chain (PEM)")
    parser.add_argument("--tls-key", help="the key of --tls-cert (PEM)")
    parser.add_argument(
        "--secure-cookies",
        action="store_true",
        help="mark the session cookie Secure although TLS ends in a proxy in front",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="serve plain HTTP on an address other than loopback (tokens cross the network in clear)",
    )
    parser.add_argument(
        "--sessions-max",
        type=int,
        default=SessionLimits.signed_in_max,
        help="signed-in sessions held at once (the least recently used goes first)",
    )
    parser.add_argument(
        "--session-idle-seconds",
        type=float,
        default=SessionLimits.idle_seconds_max,
        help="a session unused this long is signed out",
    )
    parser.add_argument("--port-file", help="write the bound port here (with --listen HOST:0)")
    arguments = parser.parse_args(argv)
    if (arguments.client_certificate is None) != (arguments.client_key is None):
        parser.error("--client-certificate and --client-key come together")
    if (arguments.tls_cert is None) != (arguments.tls_key is None):
        parser.error("--tls-cert and --tls-key come together")
    if not (arguments.tls_cert or arguments.secure_cookies or arguments.insecure or _loopback(arguments.listen)):
        parser.error(
            f"--listen {arguments.listen}: plain HTTP off loopback carries bearer tokens in clear; "
            "give --tls-cert/--tls-key, --secure-cookies (TLS ends in a proxy) or --insecure"
        )
    if arguments.sessions_max < 1 or arguments.session_idle_seconds <= 0:
        parser.error("--sessions-max and --session-idle-seconds must be positive")
    return arguments


def _loopback(listen: str) -> bool:
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bound_socket(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    return sock


def main(argv: list[str] | None = None) -> int:
    """Runs the console with ``argv`` (default: the process's) until stopped; returns the exit code."""
    try:
        # The extra's packages, imported here rather than at the top of the module.
        import uvicorn

        from effect_ledger_client.console.app import create_app
        from effect_ledger_client.console.web import ConsoleSettings
    except ImportError as error:
        sys.stderr.write(
            f"error: effect-ledger-console needs the console extra ({error.name} is missing): "
            "pip install 'effect-ledger-client[console]'\n"
        )
        return EXIT_MISSING_EXTRA
    arguments = parse_arguments(argv)
    settings = ConsoleSettings(
        server=arguments.server,
        root_certificates=arguments.root_certificates,
        client_certificate=arguments.client_certificate,
        client_key=arguments.client_key,
        secure_cookies=arguments.secure_cookies,
        session_limits=SessionLimits(
            signed_in_max=arguments.sessions_max, idle_seconds_max=arguments.session_idle_seconds
        ),
    )
    try:
        sock = _bound_socket(arguments.listen)
    except (OSError, ValueError) as error:
        print(f"effect-ledger-console: cannot listen on {arguments.listen}: {error}", file=sys.stderr)
        return 2
    if arguments.port_file:
        Path(arguments.port_file).write_text(str(sock.getsockname()[1]))
    config = uvicorn.Config(
        create_app(settings),
        ssl_certfile=arguments.tls_cert,
        ssl_keyfile=arguments.tls_key,
        log_level="warning",
        timeout_graceful_shutdown=2,
        proxy_headers=False,
    )
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
