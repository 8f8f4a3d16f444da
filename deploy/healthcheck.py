"""The image's HEALTHCHECK: grpc.health.v1 Check of the whole server (service "").

Exits 0 when the server answers SERVING, 1 otherwise. With ``--any-status`` it exits 0 on any
answer of the health service, NOT_SERVING included: the process is up and its event loop
answers, whether or not its database does (a liveness check, which must not restart a server
because PostgreSQL is away; deploy/k8s uses it so). It connects to 127.0.0.1:50051 (the
default listen port) the way the server listens: plaintext without EFFECT_LEDGER_TLS_CERT,
otherwise TLS, trusting the CA in HEALTHCHECK_TLS_CA and checking that the server's
certificate names HEALTHCHECK_TLS_SERVER_NAME (default localhost). When the server requires
client certificates (EFFECT_LEDGER_TLS_CLIENT_CA), it presents HEALTHCHECK_TLS_CLIENT_CERT
and HEALTHCHECK_TLS_CLIENT_KEY.
"""

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TARGET = "127.0.0.1:50051"
TIMEOUT_SECONDS = 3.0


def read(variable: str) -> bytes:
    path = os.environ.get(variable, "")
    if not path:
        sys.exit(f"healthcheck: set {variable}")
    with open(path, "rb") as file:
        return file.read()


def channel() -> grpc.Channel:
    options = [("grpc.enable_http_proxy", 0)]
    if not os.environ.get("EFFECT_LEDGER_TLS_CERT"):
        return grpc.insecure_channel(TARGET, options=options)
    mutual = bool(os.environ.get("EFFECT_LEDGER_TLS_CLIENT_CA"))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read("HEALTHCHECK_TLS_CA"),
        private_key=read("HEALTHCHECK_TLS_CLIENT_KEY") if mutual else None,
        certificate_chain=read("HEALTHCHECK_TLS_CLIENT_CERT") if mutual else None,
    )
    server_name = os.environ.get("HEALTHCHECK_TLS_SERVER_NAME") or "localhost"
    options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(TARGET, credentials, options=options)


def main(argv: list[str]) -> int:
    any_status = "--any-status" in argv
    try:
        with channel() as connection:
            response = health_pb2_grpc.HealthStub(connection).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_SECONDS
            )
    except grpc.RpcError as error:
        print(f"healthcheck: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"healthcheck: {error}", file=sys.stderr)
        return 1
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(f"healthcheck: {name}")
    return 0 if any_status or response.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
