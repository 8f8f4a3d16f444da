"""Server plumbing: reflection, health per service, message size limit, graceful shutdown."""

from __future__ import annotations

import signal

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from support import ServerProcess, authorize_request, new_run, raises_error

EXPECTED_SERVICES = {
    "effectledger.v1.Gate",
    "effectledger.v1.Runs",
    "effectledger.v1.ToolRegistry",
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
}


def test_reflection_lists_every_service_and_resolves_methods(server):
    with grpc.insecure_channel(server.target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert set(database.get_services()) >= EXPECTED_SERVICES
        descriptor = database.FindFileContainingSymbol("effectledger.v1.Gate")
        assert descriptor.name == "effectledger/v1/gate.proto"


def test_health_answers_for_the_server_and_each_service(server):
    for service in ("", "effectledger.v1.Gate", "effectledger.v1.Runs", "effectledger.v1.ToolRegistry"):
        assert server.health(service) == health_pb2.HealthCheckResponse.SERVING


def test_a_message_over_the_size_limit_is_refused(server, tenant):
    agent = tenant.client(server, "agent")
    run_id = new_run(agent)
    huge = b'{"a":"' + b"x" * (5 * 1024 * 1024) + b'"}'
    with raises_error("RESOURCE_EXHAUSTED"):
        agent.gate.AuthorizeEffect(authorize_request(run_id, "k", arguments=huge))


def test_sigterm_shuts_down_gracefully(database_url):
    process = ServerProcess(database_url).start()
    process.process.send_signal(signal.SIGTERM)
    assert process.process.wait(timeout=15) == 0
    assert "shutting down" in process.log()
