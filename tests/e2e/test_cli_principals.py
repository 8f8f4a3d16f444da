"""`effect-ledger principal list|disable|enable|rotate|expire`: an operator manages tokens
without SQL, and the running server refuses or accepts them on the next call."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from effect_ledger.client import LedgerClient
from effectledger.v1 import runs_pb2


def cli(database_url: str, tenant: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "effect_ledger", "principal", arguments[0], "--database-url", database_url]
    command += ["--tenant", tenant, *arguments[1:]]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)


def works(server, token: str) -> bool:
    client = LedgerClient(server.target, token)
    try:
        client.runs.CreateRun(runs_pb2.CreateRunRequest())
        return True
    except Exception as error:  # the client raises the service's own error classes
        assert getattr(error, "grpc_code", None) == grpc.StatusCode.UNAUTHENTICATED, error
        return False
    finally:
        client.close()


def test_an_operator_disables_rotates_and_expires_tokens(server, tenant, database_url):
    token = tenant.tokens["agent"]
    listed = cli(database_url, tenant.name, "list").stdout.splitlines()
    assert [line.split("\t")[0] for line in listed] == ["admin", "agent", "auditor", "reviewer"]
    assert "token_expires_at=never" in listed[1] and "disabled_at=-" in listed[1]

    cli(database_url, tenant.name, "disable", "--id", "agent")
    assert not works(server, token)
    cli(database_url, tenant.name, "enable", "--id", "agent")
    assert works(server, token)

    rotated = cli(database_url, tenant.name, "rotate", "--id", "agent").stdout.splitlines()[-1]
    assert rotated.startswith("elt_") and rotated != token
    assert not works(server, token) and works(server, rotated)

    cli(database_url, tenant.name, "expire", "--id", "agent")  # now
    assert not works(server, rotated)
    cli(database_url, tenant.name, "expire", "--id", "agent", "--in-seconds", "3600")
    assert works(server, rotated)
    cli(database_url, tenant.name, "expire", "--id", "agent", "--at", "2000-01-01T00:00:00+00:00")
    assert not works(server, rotated)
    cli(database_url, tenant.name, "expire", "--id", "agent", "--never")
    assert works(server, rotated)


def test_bad_arguments_are_refused_with_a_message(tenant, database_url):
    with pytest.raises(subprocess.CalledProcessError) as unknown:
        cli(database_url, tenant.name, "disable", "--id", "nobody")
    assert "no principal 'nobody'" in unknown.value.stderr
    with pytest.raises(subprocess.CalledProcessError) as naive:
        cli(database_url, tenant.name, "expire", "--id", "agent", "--at", "2030-01-01T00:00:00")
    assert "time zone" in naive.value.stderr
