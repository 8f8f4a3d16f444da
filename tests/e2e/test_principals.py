"""Tokens that can be managed over the API (Principals service): listed, disabled, enabled,
rotated and expired, each refused on the caller's next call, on every server process."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from effect_ledger.client import error_from_rpc
from effectledger.v1 import (
    gate_pb2,
    gate_pb2_grpc,
    principals_pb2,
    principals_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    tools_pb2_grpc,
)
from support import contract, new_tenant, servers_on_fresh_database


def bearer(token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),)


class Caller:
    """Raw stubs with one principal's token, over a real channel."""

    def __init__(self, target: str, token: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.token = token
        self.principals = principals_pb2_grpc.PrincipalsStub(self.channel)
        self.runs = runs_pb2_grpc.RunsStub(self.channel)
        self.gate = gate_pb2_grpc.GateStub(self.channel)
        self.tools = tools_pb2_grpc.ToolRegistryStub(self.channel)

    def call(self, method, request):
        return method(request, metadata=bearer(self.token), timeout=10)

    def create_run(self) -> str:
        return self.call(self.runs.CreateRun, runs_pb2.CreateRunRequest()).run_id

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def callers(server, tenant):
    made: list[Caller] = []

    def make(principal_id: str, token: str | None = None, target: str | None = None) -> Caller:
        caller = Caller(target or server.target, token or tenant.tokens[principal_id])
        made.append(caller)
        return caller

    yield make
    for caller in made:
        caller.close()


def refused(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as error:
        call(*args)
    return error.value


def at(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def test_an_admin_lists_the_tenant_and_others_see_only_themselves(callers, database_url):
    admin, agent = callers("admin"), callers("agent")
    listed = admin.call(admin.principals.ListPrincipals, principals_pb2.ListPrincipalsRequest())
    assert [p.principal_id for p in listed.principals] == ["admin", "agent", "auditor", "reviewer"]
    assert listed.principals[1].roles == ["agent"]
    assert not listed.principals[1].HasField("disabled_at")
    own = agent.call(agent.principals.ListPrincipals, principals_pb2.ListPrincipalsRequest())
    assert [p.principal_id for p in own.principals] == ["agent"]
    # Another tenant's admin neither sees nor touches this tenant's principals.
    stranger = callers("admin", token=new_tenant(database_url).tokens["admin"])
    seen = stranger.call(stranger.principals.ListPrincipals, principals_pb2.ListPrincipalsRequest())
    assert "agent" in {p.principal_id for p in seen.principals}  # its own agent, not ours
    error = refused(
        stranger.call,
        stranger.principals.DisablePrincipal,
        principals_pb2.DisablePrincipalRequest(principal_id="nobody"),
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert agent.create_run()


def test_a_disabled_principal_is_refused_at_once_and_an_enabled_one_comes_back(callers):
    admin, agent = callers("admin"), callers("agent")
    assert agent.create_run()
    disabled = admin.call(
        admin.principals.DisablePrincipal,
        principals_pb2.DisablePrincipalRequest(principal_id="agent"),
    )
    assert disabled.HasField("disabled_at")
    error = refused(agent.create_run)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_from_rpc(error).reason == "TOKEN_UNKNOWN"
    admin.call(
        admin.principals.EnablePrincipal,
        principals_pb2.EnablePrincipalRequest(principal_id="agent"),
    )
    assert agent.create_run()


def test_only_admins_manage_and_no_admin_disables_itself(callers):
    admin, agent = callers("admin"), callers("agent")
    error = refused(
        agent.call,
        agent.principals.DisablePrincipal,
        principals_pb2.DisablePrincipalRequest(principal_id="reviewer"),
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    error = refused(
        agent.call,
        agent.principals.SetTokenExpiry,
        principals_pb2.SetTokenExpiryRequest(principal_id="agent", never=True),
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    # The holder rotates its own token, but cannot choose its expiry, nor rotate another's.
    error = refused(
        agent.call,
        agent.principals.RotateToken,
        principals_pb2.RotateTokenRequest(principal_id="agent", expires_in_seconds=10**6),
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    error = refused(
        agent.call,
        agent.principals.RotateToken,
        principals_pb2.RotateTokenRequest(principal_id="reviewer"),
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    error = refused(
        admin.call,
        admin.principals.DisablePrincipal,
        principals_pb2.DisablePrincipalRequest(principal_id="admin"),
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_from_rpc(error).reason == "CANNOT_DISABLE_SELF"
    error = refused(
        admin.call,
        admin.principals.SetTokenExpiry,
        principals_pb2.SetTokenExpiryRequest(principal_id="agent"),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_rotated_token_replaces_the_old_one_at_once(callers):
    admin, agent = callers("admin"), callers("agent")
    rotated = agent.call(agent.principals.RotateToken, principals_pb2.RotateTokenRequest(principal_id="agent"))
    assert rotated.token.startswith("elt_") and rotated.token != agent.token
    assert rotated.principal.HasField("token_issued_at") and not rotated.principal.HasField("token_expires_at")
    assert refused(agent.create_run).code() == grpc.StatusCode.UNAUTHENTICATED
    renewed = callers("agent", token=rotated.token)
    assert renewed.create_run()
    # An admin rotates it again, with an expiry the new token carries.
    again = admin.call(
        admin.principals.RotateToken,
        principals_pb2.RotateTokenRequest(principal_id="agent", expires_in_seconds=3600),
    )
    assert refused(renewed.create_run).code() == grpc.StatusCode.UNAUTHENTICATED
    expires = again.principal.token_expires_at.ToDatetime(tzinfo=UTC)
    assert timedelta(minutes=59) < expires - datetime.now(UTC) <= timedelta(minutes=61)
    assert callers("agent", token=again.token).create_run()


def test_an_expired_token_is_refused_on_every_path(callers, backend):
    """Expired by an admin: refused by the general path and, on PostgreSQL, by the gate's own
    SQL functions (AuthorizeEffect and the attempt reports authenticate in their first round trip)."""
    admin, agent = callers("admin"), callers("agent")
    admin.call(admin.tools.PutToolContract, contract())
    run_id = agent.create_run()
    allowed = agent.call(
        agent.gate.AuthorizeEffect,
        gate_pb2.AuthorizeEffectRequest(
            run_id=run_id, tool="email.send", arguments_json=b"{}", idempotency_key="k1", target="t"
        ),
    )
    soon = datetime.now(UTC) + timedelta(seconds=2)
    expiring = admin.call(
        admin.principals.SetTokenExpiry,
        principals_pb2.SetTokenExpiryRequest(principal_id="agent", expires_at=at(soon)),
    )
    assert expiring.token_expires_at.ToDatetime(tzinfo=UTC) == soon.replace(microsecond=soon.microsecond)
    assert agent.create_run()  # not yet
    time.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()) + 0.3)
    for attempt in (
        agent.create_run,
        lambda: agent.call(
            agent.gate.AuthorizeEffect,
            gate_pb2.AuthorizeEffectRequest(
                run_id=run_id,
                tool="email.send",
                arguments_json=b"{}",
                idempotency_key="k2",
                target="t",
            ),
        ),
        lambda: agent.call(agent.gate.RecordDispatch, gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id)),
    ):
        error = refused(attempt)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error.details()
    admin.call(
        admin.principals.SetTokenExpiry,
        principals_pb2.SetTokenExpiryRequest(principal_id="agent", never=True),
    )
    agent.call(agent.gate.RecordDispatch, gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id))


@pytest.mark.postgres
@pytest.mark.multiprocess
def test_a_disabled_token_is_refused_by_every_server_process():
    with servers_on_fresh_database("principals", 2) as (_url, (first, second), tenant):
        admin = Caller(first.target, tenant.tokens["admin"])
        on_second = Caller(second.target, tenant.tokens["agent"])
        try:
            assert on_second.create_run()
            admin.call(
                admin.principals.DisablePrincipal,
                principals_pb2.DisablePrincipalRequest(principal_id="agent"),
            )
            assert refused(on_second.create_run).code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            admin.close()
            on_second.close()


def test_a_token_bound_to_a_certificate_is_refused_without_it_on_every_path(callers, tenant, database_url):
    """Bound (`effect-ledger principal bind`), the agent's token is refused over plaintext by the
    general path and, on PostgreSQL, by the gate's fast paths. (With the certificate, over mTLS:
    tests/e2e/test_tls.py.)"""
    import subprocess
    import sys

    admin, agent = callers("admin"), callers("agent")
    admin.call(admin.tools.PutToolContract, contract())
    run_id = agent.create_run()
    allowed = agent.call(
        agent.gate.AuthorizeEffect,
        gate_pb2.AuthorizeEffectRequest(
            run_id=run_id, tool="email.send", arguments_json=b"{}", idempotency_key="b1", target="t"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "effect_ledger",
            "principal",
            "bind",
            "--database-url",
            database_url,
            "--tenant",
            tenant.name,
            "--id",
            "agent",
            "--subject",
            "CN=agent-7,O=Example",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    listed = admin.call(admin.principals.ListPrincipals, principals_pb2.ListPrincipalsRequest())
    assert next(p for p in listed.principals if p.principal_id == "agent").client_subject == "CN=agent-7,O=Example"
    for attempt in (
        agent.create_run,
        lambda: agent.call(
            agent.gate.AuthorizeEffect,
            gate_pb2.AuthorizeEffectRequest(
                run_id=run_id,
                tool="email.send",
                arguments_json=b"{}",
                idempotency_key="b2",
                target="t",
            ),
        ),
        lambda: agent.call(agent.gate.RecordDispatch, gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id)),
    ):
        error = refused(attempt)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_from_rpc(error).reason == "CLIENT_CERTIFICATE_MISMATCH"
